"""Utility, forgetting and functional-distance metrics (DESIGN.md §4).

An unlearned model is judged next to the model retrained without the forgotten data, as
absolute gaps, never on its own numbers: a forget accuracy of 90% means little if the retrained
model also scores 90% because the forgotten samples look like the rest of the data.

- ``evaluate_splits``: accuracy per named split (``test_acc``, ``retain_acc``, ``forget_acc`` …).
- ``functional_distance``: how differently two models behave on the same inputs (output KL,
  logit MSE, prediction agreement); the parameter gap is reported only as a secondary number,
  because different weights can compute the same function.
- ``gaps_to_reference``: ``|row[key] − reference[key]|`` per metric.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedunlearn.federation.local import Tensors, accuracy, predict_logits

DEFAULT_GAP_KEYS = ("test_acc", "retain_acc", "forget_acc", "mia_auc")


def evaluate_splits(model: nn.Module, splits: Mapping[str, Tensors]) -> dict[str, float]:
    """``{"<name>_acc": accuracy}`` for every split; an empty split gives NaN."""
    return {f"{name}_acc": accuracy(model, data) for name, data in splits.items()}


def functional_distance(model: nn.Module, reference: nn.Module, data: Tensors) -> dict[str, float]:
    """Distance of ``model`` to ``reference`` (usually the retrained model) on ``data``.

    - ``output_kl``: mean over samples of KL(p_reference ‖ p_model) of the softmax outputs (nats);
      the reference is the distribution we want to match, so it is the first argument.
    - ``logit_mse``: mean squared difference of the logits over samples and classes.
    - ``prediction_agreement``: fraction of samples with the same argmax.
    - ``param_gap``: L2 norm of the difference of all parameters (secondary: it is not invariant
      to reparametrisations such as permuted hidden units).
    """
    if len(data) == 0:
        raise ValueError("functional_distance needs at least one sample")
    logits = predict_logits(model, data.x)
    reference_logits = predict_logits(reference, data.x)
    if logits.shape != reference_logits.shape:
        raise ValueError(f"model and reference disagree on the output shape: "
                         f"{tuple(logits.shape)} vs {tuple(reference_logits.shape)}")
    output_kl = F.kl_div(F.log_softmax(logits, dim=1), F.log_softmax(reference_logits, dim=1),
                         reduction="batchmean", log_target=True)
    return {
        "output_kl": float(output_kl),
        "logit_mse": float(F.mse_loss(logits, reference_logits)),
        "prediction_agreement": float((logits.argmax(1) == reference_logits.argmax(1)).float().mean()),
        "param_gap": parameter_gap(model, reference),
    }


@torch.no_grad()
def parameter_gap(model: nn.Module, reference: nn.Module) -> float:
    """‖θ_model − θ_reference‖₂ over all parameters; the two must share an architecture."""
    params = dict(model.named_parameters())
    reference_params = dict(reference.named_parameters())
    if params.keys() != reference_params.keys() or any(
            params[name].shape != reference_params[name].shape for name in params):
        raise ValueError("parameter_gap needs two models with the same architecture")
    squared = sum(float((params[name] - reference_params[name].to(params[name].device)).pow(2).sum())
                  for name in params)
    return math.sqrt(squared)


def gaps_to_reference(row: Mapping[str, Any], reference_row: Mapping[str, Any],
                      keys: Iterable[str] = DEFAULT_GAP_KEYS) -> dict[str, float | None]:
    """``{"abs_gap_<key>": |row[key] − reference_row[key]|}``; None where either value is missing,
    None or NaN (a metric that was not measured has no gap, rather than a misleading 0)."""
    gaps: dict[str, float | None] = {}
    for key in keys:
        value, reference_value = row.get(key), reference_row.get(key)
        measured = value is not None and reference_value is not None and not (
            math.isnan(value) or math.isnan(reference_value))
        gaps[f"abs_gap_{key}"] = abs(float(value) - float(reference_value)) if measured else None
    return gaps
