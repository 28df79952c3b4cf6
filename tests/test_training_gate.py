"""The gate on an original (``fedunlearn.training_gate``): a training that failed is refused with the
setting to change, one that learnt is let through; and the train flow registers nothing it refused."""

import math

import numpy as np
import pytest
import yaml

from fedunlearn.training_gate import TrainingRejected, judge_training, majority_rate

LABELS = np.array([0] * 60 + [1] * 20 + [2] * 20)  # the majority class is 60 % of the test split


def test_a_model_that_learnt_passes():
    verdict = judge_training(0.85, LABELS, [2.1, 1.2, 0.7], floor=0.5, lr=0.05, momentum=0.0, rounds=3)
    assert verdict.passed and verdict.problems == [] and verdict.majority_rate == pytest.approx(0.6)


def test_a_collapsed_model_no_better_than_the_majority_class_is_refused_naming_lr_and_momentum():
    verdict = judge_training(0.60, LABELS, [2.3, 2.3], floor=0.0, lr=0.1, momentum=0.9, rounds=2)
    assert not verdict.passed
    message = verdict.message("clinic-hfl")
    assert "most common class (0.6000)" in message and "train.lr (now 0.1)" in message, message
    assert "train.momentum (now 0.9)" in message and "scenarios.clinic-hfl.train" in message


def test_a_nan_loss_is_refused_naming_its_round_and_lr():
    verdict = judge_training(0.9, LABELS, [1.0, math.nan, math.nan], floor=0.0, lr=5.0, momentum=0.0, rounds=3)
    assert not verdict.passed
    assert "nan in round 2" in verdict.problems[0] and "train.lr (now 5)" in verdict.problems[0]
    assert "momentum" not in verdict.problems[0]  # no momentum to lower


def test_below_the_configured_floor_is_refused_naming_the_floor_and_rounds():
    verdict = judge_training(0.70, LABELS, [1.0, 0.8], floor=0.8, lr=0.05, momentum=0.0, rounds=2)
    assert not verdict.passed and "train.min_test_acc (0.8)" in verdict.problems[0]
    assert "train.rounds (now 2)" in verdict.problems[0]
    assert judge_training(0.80, LABELS, [1.0, 0.8], floor=0.8, lr=0.05, momentum=0.0, rounds=2).passed


def test_majority_rate():
    assert majority_rate(np.array([1, 1, 2])) == pytest.approx(2 / 3) and majority_rate(np.array([], int)) == 0.0


def test_a_diverged_original_is_not_registered_and_the_setting_is_named(workspace, prefect_server):
    import mlflow

    from flows.train import train_federated
    from stores.registry import tracking_uri

    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["scenarios"]["digits-hfl"]["train"].update(lr=50.0, momentum=0.9)  # diverges at once
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(TrainingRejected) as refused:
        train_federated(scenario="digits-hfl", root=str(workspace), client_tasks=False)
    assert "train.lr (now 50)" in str(refused.value) and "train.momentum (now 0.9)" in str(refused.value)
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))
    assert not client.search_model_versions("name='digits-hfl'")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [run.info.status for run in runs] == ["FAILED"]
