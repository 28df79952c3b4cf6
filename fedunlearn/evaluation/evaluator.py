"""The evaluator: every model of one deletion batch — original, unlearned, retrained — measured
on the same sets, the same way, in the benchmark and in the pipeline (DESIGN.md §4).

    evaluation_sets(federation, batch)  test / retained / forget splits, label-matched non-members,
                                        shadow-model splits (built once per batch)
    Evaluator(federation, batch).evaluate(model) → Evaluation
        test / retained / forget accuracy, membership attacks (confidence, loss, shadow), the
        backdoor's success rate, class-removal splits, functional distance to a reference

The test set is split once: half is the pool non-members are drawn from (matched to the forget
set's label histogram — under label skew anything else measures the label mix), half trains and
tests the shadow model of the Shokri attack. The shadow model is trained centrally, with the
scenario's architecture and as many epochs as a client sees in the original training; it depends
on none of the batch's choices, so a pipeline keeps it between batches (``shadow_key``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedunlearn.evaluation.backdoor import backdoor_hits, triggered
from fedunlearn.evaluation.metrics import functional_distance
from fedunlearn.evaluation.mia import attack_metrics, label_matched_nonmembers, run_population_attacks
from fedunlearn.evaluation.records import Evaluation, Evidence
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.local import Tensors, predict_logits, sgd_epochs
from fedunlearn.federation.protocol import Federation


def concat(parts: list[Tensors]) -> Tensors:
    """Concatenate splits (all-empty input gives the first, empty, split)."""
    if not any(len(p) for p in parts):
        return parts[0]
    parts = [p for p in parts if len(p)]
    return Tensors(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]),
                   np.concatenate([p.sample_ids for p in parts]))


@dataclass
class EvaluationSets:
    test: Tensors
    retained: Tensors
    forget: Tensors
    nonmembers: Tensors
    shadow_in: Tensors
    shadow_out: Tensors


def evaluation_sets(federation: Federation, forget_set: ForgetSet, *,
                    clean_forget_labels: np.ndarray | None = None) -> EvaluationSets:
    """The batch's sets from ``federation``'s data (the data before the batch: the forget samples
    are still in it). ``clean_forget_labels``, when the forget samples carry the backdoor trigger
    and label 0 (the federation's clients are poisoned already): their labels before poisoning.
    The non-members are then matched on those labels and triggered the same way (matched on the
    poisoned label they would all be zeros, which any model scores more confidently)."""
    seed, device, test = federation.seed, federation.device, federation.test
    order = np.random.default_rng([seed, 7]).permutation(len(test))
    pool = test.select(np.isin(np.arange(len(test)), order[: len(order) // 2]))
    shadow = test.select(np.isin(np.arange(len(test)), order[len(order) // 2:]))
    forget = federation.forget_data(forget_set)
    match_on = forget.y.cpu().numpy() if clean_forget_labels is None else np.asarray(clean_forget_labels)
    rows = label_matched_nonmembers(match_on, pool.y.cpu().numpy(), seed)
    index = torch.as_tensor(rows, device=device)
    matched = Tensors(pool.x[index], pool.y[index], pool.sample_ids[rows])
    if clean_forget_labels is not None:
        matched = triggered(matched)
    shadow_half = np.arange(len(shadow)) < len(shadow) // 2
    return EvaluationSets(test=test, retained=concat(federation.retained_clients(forget_set)), forget=forget,
                          nonmembers=matched, shadow_in=shadow.select(shadow_half),
                          shadow_out=shadow.select(~shadow_half))


@torch.no_grad()
def correctness(model: nn.Module, data: Tensors) -> np.ndarray:
    """Per sample, whether ``model`` predicts its label."""
    if len(data) == 0:
        return np.zeros(0, dtype=bool)
    return (predict_logits(model, data.x).argmax(1) == data.y).cpu().numpy()


def _mean(hits: np.ndarray) -> float:
    return float(hits.mean()) if len(hits) else float("nan")


def train_shadow_model(federation: Federation, shadow_in: Tensors) -> nn.Module:
    """The population attacks' shadow model: the federation's architecture trained centrally on
    ``shadow_in`` (held-out rows) for as many epochs as a client trains in all rounds."""
    config = federation.train_config
    shadow = federation.model_from(federation.engine().initial_state())
    sgd_epochs(shadow, shadow_in, epochs=config.rounds * config.local_epochs, lr=config.lr,
               batch_size=config.batch_size, momentum=config.momentum,
               generator=torch.Generator().manual_seed(federation.seed))
    return shadow


def shadow_key(federation: Federation, shadow_in: Tensors) -> str:
    """What the shadow model depends on — its rows, the training settings, the seed, the
    architecture — as a digest: the same key, the same shadow model (reusable across batches
    until a request deletes one of its rows)."""
    parts = [federation.setting, federation.seed, federation.train_config.model_dump_json(),
             sorted(map(str, shadow_in.sample_ids.tolist())),
             [(name, list(p.shape)) for name, p in federation.model_from(federation.engine().initial_state())
              .state_dict().items()]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


class Evaluator:
    """Evaluates models of one batch. ``shadow_model``: the population attacks' shadow model
    (``train_shadow_model`` on ``sets.shadow_in``), trained here when not given."""

    def __init__(self, federation: Federation, forget_set: ForgetSet, *, backdoor: bool = False,
                 sets: EvaluationSets | None = None, shadow_model: nn.Module | None = None):
        self.federation, self.forget_set, self.backdoor = federation, forget_set, backdoor
        self.sets = sets or evaluation_sets(federation, forget_set)
        self.shadow_model = shadow_model or train_shadow_model(federation, self.sets.shadow_in)

    def evaluate(self, model: nn.Module, reference: nn.Module | None = None) -> Evaluation:
        sets = self.sets
        correct = {"test": correctness(model, sets.test), "retain": correctness(model, sets.retained),
                   "forget": correctness(model, sets.forget)}
        attacks = run_population_attacks(model, sets.forget, sets.nonmembers,
                                         (self.shadow_model, sets.shadow_in, sets.shadow_out))
        extra = attack_metrics(attacks)
        mia_auc = extra.pop("mia_auc")
        hits = backdoor_hits(model, sets.test) if self.backdoor else None
        if self.forget_set.labels:  # class removal: utility on the other classes, forgetting on these
            forgotten = np.isin(sets.test.y.cpu().numpy(), self.forget_set.labels)
            correct["remaining_classes_test"] = correct["test"][~forgotten]
            correct["forgotten_classes_test"] = correct["test"][forgotten]
            extra["remaining_classes_test_acc"] = _mean(correct["remaining_classes_test"])
            extra["forgotten_classes_test_acc"] = _mean(correct["forgotten_classes_test"])
        if reference is not None:
            extra.update(functional_distance(model, reference, sets.test))
        return Evaluation(test_acc=_mean(correct["test"]), retain_acc=_mean(correct["retain"]),
                          forget_acc=_mean(correct["forget"]), mia_auc=mia_auc,
                          bd_asr=_mean(hits) if hits is not None else None, extra=extra,
                          evidence=Evidence(correct, attacks, hits, self.federation.num_classes))
