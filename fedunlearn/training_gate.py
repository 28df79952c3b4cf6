"""The gate on an original: a training that failed is not registered as a model to serve.

A federated training can fail without raising: a learning rate or momentum too high for the data
makes the loss blow up (NaN) or collapses every prediction onto one class, and the model is
registered and served all the same — and every later batch unlearns from it and gates against it.
The original is refused when a round's training loss is not a finite number, when its test accuracy
is no better than always answering the most common test class (it learnt nothing), or when it is
below the floor the scenario sets (``train.min_test_acc``). The refusal names the settings to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedunlearn.errors import InputError


class TrainingRejected(InputError):
    """The scenario's training produced no model worth serving; nothing was registered."""


@dataclass(frozen=True)
class TrainingVerdict:
    passed: bool
    test_acc: float
    majority_rate: float  # the test accuracy of always answering the most common test class
    floor: float
    problems: list[str] = field(default_factory=list)

    def message(self, scenario: str) -> str:
        return (f"the training of {scenario} failed, so it was not registered as the original: "
                f"{'; '.join(self.problems)}. Change the setting named in params.yaml (scenarios.{scenario}.train) "
                f"and train again")


def majority_rate(labels: np.ndarray) -> float:
    """The share of the most common label (0 for no labels)."""
    labels = np.asarray(labels).reshape(-1)
    return float(np.bincount(labels).max() / len(labels)) if len(labels) else 0.0


def judge_training(test_acc: float, test_labels: np.ndarray, train_losses: list[float], floor: float,
                   lr: float, momentum: float, rounds: int) -> TrainingVerdict:
    """Whether an original may be registered: every round's loss finite, the test accuracy above the
    majority-class rate and at least ``floor``. Each problem says which setting to change."""
    problems: list[str] = []
    bad_round = next((k for k, loss in enumerate(train_losses, 1) if not math.isfinite(loss)), None)
    if bad_round is not None:
        problems.append(f"the training loss became {train_losses[bad_round - 1]} in round {bad_round} (it diverged): "
                        f"lower train.lr (now {lr:g})" + (f" or train.momentum (now {momentum:g})" if momentum else ""))
    rate = majority_rate(test_labels)
    if not math.isfinite(test_acc) or test_acc <= rate:
        problems.append(f"test accuracy {test_acc:.4f} is no better than always answering the most common class "
                        f"({rate:.4f}): the model learnt nothing — lower train.lr (now {lr:g})"
                        + (f" or train.momentum (now {momentum:g})" if momentum else "")
                        + f", or raise train.rounds (now {rounds})")
    elif test_acc < floor:
        problems.append(f"test accuracy {test_acc:.4f} is below train.min_test_acc ({floor:g}): raise train.rounds "
                        f"(now {rounds}) or train.local_epochs, tune train.lr (now {lr:g}), or lower "
                        "train.min_test_acc")
    return TrainingVerdict(not problems, float(test_acc), rate, floor, problems)
