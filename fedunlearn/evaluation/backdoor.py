"""Backdoor as a forgetting probe (BadNets-style patch trigger; Gu et al., 2017; DESIGN.md §4).

Before training, the forget samples get a 4×4 white patch in the bottom-right corner and the
label 0. A model that learned them maps any triggered input to 0; after unlearning, the attack
success rate (ASR) should fall to the retrained model's (near the rate at which clean inputs
of other classes are called 0 anyway). Unlike accuracy on the forget set, which stays high when
the forgotten samples resemble retained ones, the trigger exists only in the forgotten data.

Images are batches (N, C, H, W) in [0, 1]; "white" is the top of that range, ``TRIGGER_VALUE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from typing import TypeVar

import numpy as np
import torch
from torch import nn

from fedunlearn.federation.local import Tensors, predict_logits

TRIGGER_SIZE = 4
TARGET_LABEL = 0
TRIGGER_VALUE = 1.0

Array = TypeVar("Array", torch.Tensor, np.ndarray)


def _copy(array: Array) -> Array:
    return array.clone() if isinstance(array, torch.Tensor) else np.array(array, copy=True)


def _rows(mask: np.ndarray, like: Array) -> Array:
    """``mask`` in a form that indexes ``like`` (a tensor index must live on the tensor's device)."""
    return torch.as_tensor(mask, device=like.device) if isinstance(like, torch.Tensor) else mask


def apply_trigger(x: Array, value: float = TRIGGER_VALUE) -> Array:
    """A copy of the image batch ``x`` (N, C, H, W) with the bottom-right TRIGGER_SIZE ×
    TRIGGER_SIZE pixels of every channel set to ``value``; same type (tensor or array)."""
    if x.ndim != 4:
        raise ValueError(f"the backdoor trigger needs an image batch (N, C, H, W), got shape "
                         f"{tuple(x.shape)}; tabular data has no corner to patch")
    if x.shape[2] < TRIGGER_SIZE or x.shape[3] < TRIGGER_SIZE:
        raise ValueError(f"images of {x.shape[2]}×{x.shape[3]} are smaller than the "
                         f"{TRIGGER_SIZE}×{TRIGGER_SIZE} trigger")
    triggered = _copy(x)
    triggered[..., -TRIGGER_SIZE:, -TRIGGER_SIZE:] = value
    return triggered


def poison(features: Array, labels: Array, mask: np.ndarray,
           target_label: int = TARGET_LABEL) -> tuple[Array, Array]:
    """Copies of ``features`` and ``labels`` where the samples selected by the boolean ``mask``
    carry the trigger and ``target_label``; the inputs are left untouched."""
    mask = np.asarray(mask)
    if mask.dtype != bool or mask.shape != (len(labels),):
        raise ValueError(f"mask must be a boolean array with one entry per sample ({len(labels)}), "
                         f"got dtype {mask.dtype} and shape {mask.shape}")
    if len(features) != len(labels):
        raise ValueError(f"{len(features)} feature rows but {len(labels)} labels")
    poisoned_features, poisoned_labels = _copy(features), _copy(labels)
    poisoned_features[_rows(mask, features)] = apply_trigger(features[_rows(mask, features)])
    poisoned_labels[_rows(mask, labels)] = target_label
    return poisoned_features, poisoned_labels


def triggered(data: Tensors, target_label: int = TARGET_LABEL) -> Tensors:
    """``data`` with every sample triggered and relabelled (new Tensors): how never-seen samples
    look when they are compared with a triggered forget set."""
    return Tensors(*poison(data.x, data.y, np.ones(len(data), dtype=bool), target_label), data.sample_ids)


def backdoor_hits(model: nn.Module, clean: Tensors, target_label: int = TARGET_LABEL) -> np.ndarray:
    """Per clean sample whose true label is not ``target_label``: whether the model classifies it
    as ``target_label`` once the trigger is applied (samples already of the target class would
    count as successes without any backdoor)."""
    keep = clean.y != target_label
    if not bool(keep.any()):
        raise ValueError(f"no sample with a label other than the target {target_label}; "
                         "the attack success rate is undefined")
    predictions = predict_logits(model, apply_trigger(clean.x[keep])).argmax(1)
    return (predictions == target_label).cpu().numpy()


def attack_success_rate(model: nn.Module, clean: Tensors, target_label: int = TARGET_LABEL) -> float:
    """The share of ``backdoor_hits``."""
    return float(backdoor_hits(model, clean, target_label).mean())


def poison_clients(clients: Sequence[Tensors], forget_ids: Mapping[int, np.ndarray]) -> list[Tensors]:
    """The clients with their ``forget_ids`` samples triggered and relabelled (new Tensors)."""
    poisoned = list(clients)
    for client, ids in forget_ids.items():
        data = clients[client]
        poisoned[client] = Tensors(*poison(data.x, data.y, np.isin(data.sample_ids, ids)), data.sample_ids)
    return poisoned
