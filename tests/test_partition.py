import numpy as np
import pytest

from fedunlearn.data.partition import (assign_dirichlet, assign_iid, dirichlet_proportions, hash_uniform,
                                       holdout_mask, slice_features, vertical_slices)

IDS = np.array([f"s-{i:05d}" for i in range(4000)])
LABELS = np.arange(4000) % 10


def label_entropy(clients: np.ndarray, labels: np.ndarray, num_clients: int) -> float:
    """Mean entropy of the clients' label distributions (lower = more skew)."""
    entropies = []
    for c in range(num_clients):
        counts = np.bincount(labels[clients == c], minlength=10)
        if counts.sum() == 0:
            continue
        p = counts[counts > 0] / counts.sum()
        entropies.append(-(p * np.log(p)).sum())
    return float(np.mean(entropies))


def test_hash_uniform_is_deterministic_and_uniform():
    u = hash_uniform(IDS, seed=0, salt="x")
    assert np.array_equal(u, hash_uniform(IDS, seed=0, salt="x"))
    assert not np.array_equal(u, hash_uniform(IDS, seed=1, salt="x"))
    assert not np.array_equal(u, hash_uniform(IDS, seed=0, salt="y"))
    assert ((u >= 0) & (u < 1)).all()
    assert abs(u.mean() - 0.5) < 0.02


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_assignment_covers_every_sample_exactly_once(scheme):
    clients = (assign_iid(IDS, 7, seed=3) if scheme == "iid"
               else assign_dirichlet(IDS, LABELS, 7, alpha=0.5, seed=3, num_classes=10))
    assert clients.shape == IDS.shape
    assert set(np.unique(clients)) <= set(range(7))
    members = [set(IDS[clients == c]) for c in range(7)]
    assert sum(len(m) for m in members) == len(IDS)          # coverage
    assert len(set().union(*members)) == len(IDS)             # disjoint


def test_smaller_alpha_gives_more_label_skew():
    entropy = {alpha: label_entropy(assign_dirichlet(IDS, LABELS, 10, alpha, 0, 10), LABELS, 10)
               for alpha in (0.1, 1.0, 100.0)}
    assert entropy[0.1] < entropy[1.0] < entropy[100.0]
    iid = label_entropy(assign_iid(IDS, 10, 0), LABELS, 10)
    assert abs(entropy[100.0] - iid) < 0.05 and iid > 0.95 * np.log(10)


def test_dirichlet_proportions_are_distributions():
    p = dirichlet_proportions(10, 5, 0.5, seed=1)
    assert p.shape == (10, 5) and np.allclose(p.sum(axis=1), 1)


def test_deleting_samples_never_moves_another_sample():
    before = assign_dirichlet(IDS, LABELS, 10, 0.5, 0, 10)
    keep = np.ones(len(IDS), dtype=bool)
    keep[::7] = False
    after = assign_dirichlet(IDS[keep], LABELS[keep], 10, 0.5, 0, 10)
    assert np.array_equal(before[keep], after)
    held_out = holdout_mask(IDS, 0, 0.2)
    assert np.array_equal(held_out[keep], holdout_mask(IDS[keep], 0, 0.2))
    assert abs(held_out.mean() - 0.2) < 0.03


def test_vertical_slices_are_disjoint_and_cover_the_features():
    columns = vertical_slices((30,), "tabular", 3)
    covered = [i for s in columns for i in range(*s["columns"])]
    assert covered == list(range(30))
    rows = vertical_slices((1, 28, 28), "image", 3)
    x = np.random.default_rng(0).random((4, 1, 28, 28))
    parts = [slice_features(x, s) for s in rows]
    assert np.array_equal(np.concatenate(parts, axis=2), x)
    with pytest.raises(ValueError, match="at least 2 parties"):
        vertical_slices((30,), "tabular", 1)


def test_bad_partition_arguments_are_rejected():
    with pytest.raises(ValueError, match="alpha"):
        assign_dirichlet(IDS, LABELS, 3, 0.0, 0, 10)
    with pytest.raises(ValueError, match="num_clients"):
        assign_iid(IDS, 0, 0)
    with pytest.raises(ValueError, match="test_fraction"):
        holdout_mask(IDS, 0, 1.0)
