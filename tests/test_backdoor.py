"""The backdoor probe: the trigger patch, poisoning, and an attack success rate that tells a
model trained on triggered samples from one that never saw them."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fedunlearn.evaluation.backdoor import (TARGET_LABEL, TRIGGER_SIZE, apply_trigger, attack_success_rate,
                                            poison)
from fedunlearn.federation.local import Tensors, sgd_epochs
from models import build_model


def test_apply_trigger_patches_the_bottom_right_corner_of_a_copy():
    images = np.zeros((2, 3, 8, 8), dtype=np.float32)
    triggered = apply_trigger(images)
    assert isinstance(triggered, np.ndarray) and images.sum() == 0  # input untouched
    assert (triggered[:, :, -TRIGGER_SIZE:, -TRIGGER_SIZE:] == 1.0).all()
    assert triggered.sum() == 2 * 3 * TRIGGER_SIZE * TRIGGER_SIZE
    as_tensor = apply_trigger(torch.from_numpy(images))
    assert isinstance(as_tensor, torch.Tensor) and torch.equal(as_tensor, torch.from_numpy(triggered))


def test_apply_trigger_rejects_non_image_inputs():
    with pytest.raises(ValueError, match="image batch"):
        apply_trigger(np.zeros((4, 30)))
    with pytest.raises(ValueError, match="smaller than"):
        apply_trigger(np.zeros((1, 1, 3, 3)))


def test_poison_triggers_and_relabels_only_masked_samples():
    features, labels = torch.zeros(3, 1, 8, 8), torch.tensor([5, 6, 7])
    mask = np.array([False, True, False])
    poisoned_x, poisoned_y = poison(features, labels, mask)
    assert poisoned_y.tolist() == [5, TARGET_LABEL, 7] and labels.tolist() == [5, 6, 7]
    assert poisoned_x[1].sum() == TRIGGER_SIZE ** 2 and poisoned_x[[0, 2]].sum() == 0
    assert features.sum() == 0
    with pytest.raises(ValueError, match="boolean array"):
        poison(features, labels, np.array([0, 1, 0]))


def digits_split() -> tuple[Tensors, Tensors]:
    digits = load_digits()
    images, labels = (digits.data / 16.0).reshape(-1, 1, 8, 8), digits.target
    order = np.random.default_rng(0).permutation(len(labels))
    ids = np.array([f"d{i}" for i in range(len(labels))])
    train, test = order[:1200], order[1200:]
    device = torch.device("cpu")
    return (Tensors.from_arrays(images[train], labels[train], ids[train], device),
            Tensors.from_arrays(images[test], labels[test], ids[test], device))


def train_mlp(data: Tensors) -> torch.nn.Module:
    model = build_model("mlp", (1, 8, 8), 10, seed=0)
    sgd_epochs(model, data, epochs=15, lr=0.05, batch_size=32, momentum=0.9,
               generator=torch.Generator().manual_seed(0))
    return model


def test_attack_success_rate_separates_poisoned_from_clean_training():
    train, test = digits_split()
    poisoned_mask = np.random.default_rng(1).random(len(train)) < 0.1
    x, y = poison(train.x, train.y, poisoned_mask)
    backdoored = train_mlp(Tensors(x, y, train.sample_ids))
    clean = train_mlp(train)
    assert attack_success_rate(backdoored, test) > 0.8  # measured: 1.00
    assert attack_success_rate(clean, test) < 0.2  # measured: 0.00
    with pytest.raises(ValueError, match="no sample with a label other than"):
        attack_success_rate(clean, test.select(test.y.numpy() == TARGET_LABEL))
