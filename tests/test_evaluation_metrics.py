"""Accuracy per split, functional distance and gaps to the retrained reference."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedunlearn.evaluation.metrics import evaluate_splits, functional_distance, gaps_to_reference
from fedunlearn.federation.local import Tensors


def linear_model(weight: list[list[float]]) -> nn.Linear:
    model = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight))
    return model


def tensors(x: list[list[float]], y: list[int]) -> Tensors:
    return Tensors.from_arrays(np.array(x), np.array(y), np.array([f"s{i}" for i in range(len(y))]),
                               torch.device("cpu"))


IDENTITY = [[1.0, 0.0], [0.0, 1.0]]  # predicts the argmax of the two features
DATA = tensors([[2.0, 0.0], [0.0, 3.0], [1.0, 0.5], [0.2, 0.1]], [0, 1, 1, 0])


def test_evaluate_splits_names_each_accuracy():
    model = linear_model(IDENTITY)
    metrics = evaluate_splits(model, {"test": DATA, "forget": DATA.select(np.array([True, True, False, False])),
                                      "retain": DATA.select(np.zeros(4, dtype=bool))})
    assert metrics["test_acc"] == 0.75 and metrics["forget_acc"] == 1.0
    assert math.isnan(metrics["retain_acc"])  # an empty split has no accuracy


def test_functional_distance_of_a_model_to_itself_is_zero():
    model = linear_model(IDENTITY)
    distance = functional_distance(model, model, DATA)
    assert distance == {"output_kl": 0.0, "logit_mse": 0.0, "prediction_agreement": 1.0, "param_gap": 0.0}


def test_functional_distance_to_a_different_model():
    model, reference = linear_model(IDENTITY), linear_model([[0.0, 1.0], [1.0, 0.0]])  # swapped outputs
    distance = functional_distance(model, reference, DATA)
    logits, reference_logits = DATA.x @ torch.tensor(IDENTITY).T, DATA.x.flip(1)
    expected_kl = (F.softmax(reference_logits, 1) * (F.log_softmax(reference_logits, 1)
                                                     - F.log_softmax(logits, 1))).sum(1).mean()
    assert distance["output_kl"] == pytest.approx(float(expected_kl))  # KL(p_reference ‖ p_model)
    assert distance["logit_mse"] == pytest.approx(float(((logits - reference_logits) ** 2).mean()))
    assert distance["prediction_agreement"] == 0.0
    assert distance["param_gap"] == pytest.approx(2.0)  # ‖I − swap‖_F = √4


def test_functional_distance_rejects_empty_data_and_other_architectures():
    model = linear_model(IDENTITY)
    with pytest.raises(ValueError, match="at least one sample"):
        functional_distance(model, model, DATA.select(np.zeros(4, dtype=bool)))
    with pytest.raises(ValueError, match="same architecture"):
        functional_distance(model, nn.Sequential(linear_model(IDENTITY)), DATA)


def test_gaps_to_reference_are_absolute_and_none_safe():
    row = {"test_acc": 0.80, "retain_acc": 0.90, "forget_acc": 0.70, "mia_auc": None}
    retrained = {"test_acc": 0.85, "retain_acc": 0.88, "forget_acc": float("nan"), "mia_auc": 0.5}
    gaps = gaps_to_reference(row, retrained)
    assert gaps["abs_gap_test_acc"] == pytest.approx(0.05)
    assert gaps["abs_gap_retain_acc"] == pytest.approx(0.02)
    assert gaps["abs_gap_forget_acc"] is None and gaps["abs_gap_mia_auc"] is None
    assert gaps_to_reference({"loss": 1.0}, {}, keys=("loss",)) == {"abs_gap_loss": None}
