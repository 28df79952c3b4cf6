"""Partitioning that is stable under deletion.

Every assignment (test split, client, nothing else) is a function of the seed, the sample's ID
and its label only: a per-ID hash gives a uniform number, and that number picks the split and
the client. Deleting samples therefore never moves another sample: the partition of the
retained data is exactly the original partition minus the deleted IDs, which is what the
ledger promises ("current training data = partition minus ledger").

* IID: client = ⌊u·N⌋ for a hash-uniform u.
* Dirichlet(α) label skew: per class c, proportions p_c ~ Dir(α·1_N) drawn from the seed; a
  sample of class c goes to the client whose slice of the cumulative p_c contains u.
  In distribution this is the usual Dirichlet partition (Hsu et al. 2019).
* Canaries (privacy audits; Carlini et al. 2019, "The secret sharer"; Jagielski et al. 2020,
  "Auditing differentially private machine learning"): a training sample is a mislabelled canary
  iff its hash-uniform number is below the canary fraction, and its label is replaced by one drawn
  uniformly from the other classes by a second hash of its ID. Only memorisation explains a model
  that predicts such a label, so a deletion request for canaries has a measurable membership signal.
* Vertical (VFL): every party holds all aligned samples and a disjoint slice of the features:
  contiguous column groups for tabular data, horizontal bands of rows for images.
"""

from __future__ import annotations

import hashlib

import numpy as np

_SCALE = float(2**64)


def hash_uniform(sample_ids: np.ndarray, seed: int, salt: str) -> np.ndarray:
    """A deterministic uniform number in [0, 1) per ID, independent across salts."""
    out = np.empty(len(sample_ids), dtype=np.float64)
    prefix = f"{seed}:{salt}:".encode()
    for i, sid in enumerate(sample_ids.tolist()):
        digest = hashlib.blake2b(prefix + str(sid).encode(), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "big") / _SCALE
    return out


def holdout_mask(sample_ids: np.ndarray, seed: int, test_fraction: float) -> np.ndarray:
    """True for samples held out as the test set."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    return hash_uniform(sample_ids, seed, "test") < test_fraction


def assign_iid(sample_ids: np.ndarray, num_clients: int, seed: int) -> np.ndarray:
    _check_clients(num_clients)
    u = hash_uniform(sample_ids, seed, "client")
    return np.minimum((u * num_clients).astype(np.int64), num_clients - 1)


def dirichlet_proportions(num_classes: int, num_clients: int, alpha: float, seed: int) -> np.ndarray:
    """Row c: the share of class c that each client receives."""
    if alpha <= 0:
        raise ValueError(f"Dirichlet alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(num_clients, alpha), size=num_classes)


def assign_dirichlet(sample_ids: np.ndarray, labels: np.ndarray, num_clients: int, alpha: float,
                     seed: int, num_classes: int) -> np.ndarray:
    _check_clients(num_clients)
    cumulative = np.cumsum(dirichlet_proportions(num_classes, num_clients, alpha, seed), axis=1)
    u = hash_uniform(sample_ids, seed, "client")
    clients = np.empty(len(sample_ids), dtype=np.int64)
    for c in range(num_classes):
        rows = labels == c
        clients[rows] = np.searchsorted(cumulative[c], u[rows], side="right")
    return np.minimum(clients, num_clients - 1)


def canary_mask(sample_ids: np.ndarray, seed: int, fraction: float) -> np.ndarray:
    """True for the samples that become mislabelled canaries: a function of the seed and the ID only
    (a count-based choice would promote a new canary when one is deleted, changing retained data)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"canary fraction must be in [0, 1), got {fraction}")
    return hash_uniform(sample_ids, seed, "canary") < fraction


def canary_labels(sample_ids: np.ndarray, labels: np.ndarray, seed: int, num_classes: int) -> np.ndarray:
    """A wrong label per sample, uniform over the other classes and independent of the true label,
    from a hash of the ID. Applied to samples a model never saw, it draws non-members from the
    canaries' own distribution (the audit's comparison for a canary forget set)."""
    if num_classes < 2:
        raise ValueError(f"a wrong label needs at least 2 classes, got {num_classes}")
    shift = 1 + np.minimum((hash_uniform(sample_ids, seed, "canary-label") * (num_classes - 1)).astype(np.int64),
                           num_classes - 2)
    return (np.asarray(labels, dtype=np.int64) + shift) % num_classes


def vertical_slices(input_shape: tuple[int, ...], kind: str, num_parties: int) -> list[dict]:
    """Disjoint feature slices, one per party: ``{"columns": [a, b]}`` or ``{"rows": [a, b]}``."""
    if num_parties < 2:
        raise ValueError(f"vertical FL needs at least 2 parties, got {num_parties}")
    axis_len = input_shape[0] if kind == "tabular" else input_shape[-2]
    if num_parties > axis_len:
        raise ValueError(f"cannot split {axis_len} feature {'columns' if kind == 'tabular' else 'rows'} "
                         f"across {num_parties} parties")
    bounds = np.linspace(0, axis_len, num_parties + 1).round().astype(int)
    key = "columns" if kind == "tabular" else "rows"
    return [{key: [int(bounds[p]), int(bounds[p + 1])]} for p in range(num_parties)]


def slice_features(features: np.ndarray, spec: dict) -> np.ndarray:
    if "columns" in spec:
        a, b = spec["columns"]
        return features[:, a:b]
    a, b = spec["rows"]
    return features[:, :, a:b, :]


def _check_clients(num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
