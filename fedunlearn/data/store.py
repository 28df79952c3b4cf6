"""On-disk layout of prepared data and partitions (the DVC stage outputs).

Everything is written byte-deterministically (``.npy`` arrays and sorted JSON, no timestamps),
so ``dvc repro`` in a fresh clone reproduces the same hashes for the same seed.

    data/raw/<dataset>/            features.npy labels.npy sample_ids.npy meta.json
    data/partitions/<scenario>/    manifest.json  test/  client_000/ ...   (HFL/DFL)
                                   manifest.json  test/  party_000/ ...    (VFL; labels at the active party)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedunlearn.config import Params, PartitionConfig
from fedunlearn.data.datasets import Dataset, load_source
from fedunlearn.data.partition import (assign_dirichlet, assign_iid, canary_labels, canary_mask, holdout_mask,
                                       slice_features, vertical_slices)
from fedunlearn.errors import DataNotPrepared

RAW_DIR = Path("data/raw")
# How a canary's label was drawn (``partition.canary_labels``), recorded in the manifest.
CANARY_RULE = "label + 1 + floor(v * (C - 1)) mod C, v = hash_uniform(ID, seed, 'canary-label')"
PARTITIONS_DIR = Path("data/partitions")


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _save_arrays(directory: Path, **arrays: np.ndarray) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, arr in arrays.items():
        np.save(directory / f"{name}.npy", arr, allow_pickle=False)


def _load(directory: Path, name: str) -> np.ndarray:
    path = directory / f"{name}.npy"
    if not path.is_file():
        raise FileNotFoundError(f"missing data file {path}; run `fedunlearn prepare` first")
    return np.load(path, allow_pickle=False)


def prepare_dataset(name: str, params: Params, root: Path, gone: set[str]) -> Path:
    """Stage ``prepare``: load the source, drop the ledger's IDs (``gone``), write ``data/raw/<name>``."""
    dataset = load_source(name, params.datasets.get(name), root)
    # A ledger written when a user source's IDs carried the dataset's name in front (``<dataset>-<ID>``)
    # still deletes them: the IDs are now the source's own.
    keep = np.array([sid not in gone and f"{name}-{sid}" not in gone for sid in dataset.sample_ids.tolist()],
                    dtype=bool)
    kept = dataset.subset(keep)
    out = root / RAW_DIR / name
    _save_arrays(out, features=kept.features, labels=kept.labels, sample_ids=kept.sample_ids)
    write_json(out / "meta.json", {"name": name, "kind": kept.kind, "num_classes": kept.num_classes,
                                   "class_names": kept.class_names, "num_samples": len(kept.labels),
                                   "deleted_by_ledger": int((~keep).sum())})
    return out


def load_prepared(name: str, root: Path) -> Dataset:
    directory = root / RAW_DIR / name
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"prepared dataset not found: {directory}; run `fedunlearn prepare`")
    meta = json.loads(meta_path.read_text())
    return Dataset(name, _load(directory, "features"), _load(directory, "labels"),
                   _load(directory, "sample_ids"), meta["kind"], meta["num_classes"], meta["class_names"])


# Where a fitted feature transform (tabular standardisation, PCA) takes its statistics from: the
# held-out split, never the training rows. Deleting training samples then leaves every data
# version in the same input space — a model unlearned on one data version is evaluated, gated and
# served on the next in the space it was trained in — and the transform holds nothing of a deleted
# training sample, so neither does a model (an exact retrain, or a certified removal) built on it.
# Deleting a held-out sample re-fits the transform: the deletion pipeline then retrains exactly
# (``refits_on_holdout_deletion``).
TRANSFORM_FIT_ON = "held-out split"


def refits_on_holdout_deletion(manifest: dict[str, Any]) -> bool:
    """Whether the partition's features come from a transform fit on the held-out split, so that
    deleting a held-out sample moves every sample's features (and every model's input space)."""
    return manifest.get("transform_fit_on") == TRANSFORM_FIT_ON


def _standardize(features: np.ndarray, fit_rows: np.ndarray) -> np.ndarray:
    mean = features[fit_rows].mean(axis=0)
    std = features[fit_rows].std(axis=0)
    return ((features - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)


def _transform(features: np.ndarray, fit_rows: np.ndarray, kind: str,
               unit_norm: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """The partition's feature transform, fit on ``fit_rows`` (the held-out split: see
    ``TRANSFORM_FIT_ON``): ``pca<k>`` projects the flattened samples on their first k principal
    components (scikit-learn's exact LAPACK solver with its deterministic sign convention, so
    reruns are byte-identical); ``unit_norm`` then scales every sample to L2 norm 1 — bounded
    features, as certified unlearning's Lipschitz constants need (a per-sample operation, fit on
    nothing). Returns the features and what to record in the manifest (nothing for raw features,
    so untransformed partitions keep their bytes)."""
    record: dict[str, Any] = {}
    if kind == "raw" and not unit_norm:
        return features, record
    if kind != "raw":
        from sklearn.decomposition import PCA

        flat = features.reshape(len(features), -1).astype(np.float64)
        pca = PCA(n_components=int(kind[3:]), svd_solver="full").fit(flat[fit_rows])
        features = pca.transform(flat)
        record["features"] = {"transform": kind, "explained_variance": float(pca.explained_variance_ratio_.sum())}
        record["transform_fit_on"] = TRANSFORM_FIT_ON
    if unit_norm:
        flat = features.reshape(len(features), -1).astype(np.float64)
        norms = np.linalg.norm(flat, axis=1, keepdims=True)
        features = (flat / np.where(norms > 0, norms, 1.0)).reshape(features.shape)
        record["unit_norm"] = True
    return features.astype(np.float32), record


def partition_scenario(name: str, params: Params, root: Path) -> Path:
    """Stage ``partition``: split the prepared data into test + clients (or parties)."""
    cfg = params.scenario(name)
    data = load_prepared(cfg.dataset, root)
    part = cfg.partition
    is_test = holdout_mask(data.sample_ids, params.seed, part.test_fraction)
    if (data.kind == "tabular" or part.features != "raw") and not is_test.any():
        raise ValueError(f"scenario {name}: its feature transform is fit on the held-out split, which is empty; "
                         "set partition.test_fraction > 0 in params.yaml")
    features, fitted = data.features, {}
    if data.kind == "tabular":
        features, fitted = _standardize(features, is_test), {"transform_fit_on": TRANSFORM_FIT_ON}
    features, transform = _transform(features, is_test, part.features, part.unit_norm)
    out = root / PARTITIONS_DIR / name
    manifest: dict[str, Any] = {
        "scenario": name, "dataset": cfg.dataset, "setting": cfg.setting, "partition": part.scheme,
        "seed": params.seed, "num_classes": data.num_classes, "kind": data.kind,
        "input_shape": list(features.shape[1:]), "test": _summary(data.labels[is_test], data.num_classes),
        **fitted, **transform,
    }
    _save_arrays(out / "test", features=features[is_test], labels=data.labels[is_test],
                 sample_ids=data.sample_ids[is_test])
    train_ids, train_labels, train_x = data.sample_ids[~is_test], data.labels[~is_test], features[~is_test]
    if cfg.setting == "vfl":
        slices = vertical_slices(tuple(data.features.shape[1:]), data.kind, part.num_clients)
        manifest["parties"] = []
        for p, spec in enumerate(slices):
            active = p == len(slices) - 1
            arrays = {"features": slice_features(train_x, spec), "sample_ids": train_ids,
                      "test_features": slice_features(features[is_test], spec)}
            if active:
                arrays["labels"] = train_labels
            _save_arrays(out / f"party_{p:03d}", **arrays)
            manifest["parties"].append({"party": p, "role": "active" if active else "passive",
                                        "slice": spec, "num_samples": int(len(train_ids))})
        manifest["train"] = _summary(train_labels, data.num_classes)
    else:
        manifest.update(_write_clients(out, part, params.seed, data.num_classes, train_x, train_labels, train_ids))
    write_json(out / "manifest.json", manifest)
    return out


def _write_clients(out: Path, part: PartitionConfig, seed: int, num_classes: int, train_x: np.ndarray,
                   train_labels: np.ndarray, train_ids: np.ndarray) -> dict[str, Any]:
    """HFL/DFL: each client's arrays, and the manifest's entries about them. Clients are assigned by
    the true labels, so canaries (``canary_fraction``) change labels and nothing else: a scenario with
    canaries has the clients of the same scenario without them."""
    if part.scheme == "iid":
        clients = assign_iid(train_ids, part.num_clients, seed)
    else:
        clients = assign_dirichlet(train_ids, train_labels, part.num_clients, part.alpha, seed, num_classes)
    record: dict[str, Any] = {"alpha": part.alpha if part.scheme == "dirichlet" else None, "clients": []}
    if part.canary_fraction > 0:
        is_canary = canary_mask(train_ids, seed, part.canary_fraction)
        train_labels = train_labels.copy()
        train_labels[is_canary] = canary_labels(train_ids[is_canary], train_labels[is_canary], seed, num_classes)
        record["canaries"] = {"fraction": part.canary_fraction, "rule": CANARY_RULE,
                              "ids": sorted(train_ids[is_canary].tolist())}
    for c in range(part.num_clients):
        rows = clients == c
        _save_arrays(out / f"client_{c:03d}", features=train_x[rows], labels=train_labels[rows],
                     sample_ids=train_ids[rows])
        record["clients"].append({"client": c, **_summary(train_labels[rows], num_classes)})
    return record


def canary_ids(manifest: dict[str, Any]) -> list[str]:
    """The IDs of a partition's mislabelled canaries still in its training data (none without canaries)."""
    return list(manifest.get("canaries", {}).get("ids", []))


def _summary(labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    return {"num_samples": int(len(labels)),
            "label_counts": np.bincount(labels, minlength=num_classes).astype(int).tolist()}


@dataclass
class ClientData:
    """One client's (or the test set's) arrays, keyed by stable sample IDs."""

    features: np.ndarray
    labels: np.ndarray
    sample_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class HorizontalPartition:
    manifest: dict[str, Any]
    clients: list[ClientData]
    test: ClientData
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return int(self.manifest["num_classes"])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.manifest["input_shape"])


def require_prepared(scenario: str, root: Path, command: str = "the same command") -> Path:
    """The scenario's partition manifest; ``DataNotPrepared`` (exit 2) naming it and ``fedunlearn
    prepare`` when the workspace was initialised but its data never prepared."""
    path = Path(root) / PARTITIONS_DIR / scenario / "manifest.json"
    if not path.is_file():
        raise DataNotPrepared(f"the data of {scenario} was never prepared in {Path(root)} (partition not found: "
                              f"{path} is missing). Run `fedunlearn --root {Path(root)} prepare --scenario {scenario}` "
                              f"first (`fedunlearn train` prepares it too), then {command} again")
    return path


def read_manifest(scenario: str, root: Path) -> dict[str, Any]:
    return json.loads(require_prepared(scenario, root).read_text())


def _read_split(directory: Path) -> ClientData:
    return ClientData(_load(directory, "features"), _load(directory, "labels"), _load(directory, "sample_ids"))


def load_horizontal(scenario: str, root: Path) -> HorizontalPartition:
    manifest = read_manifest(scenario, root)
    if manifest["setting"] == "vfl":
        raise ValueError(f"scenario {scenario!r} is vertical; load it with the VFL engine")
    base = root / PARTITIONS_DIR / scenario
    clients = [_read_split(base / f"client_{c['client']:03d}") for c in manifest["clients"]]
    return HorizontalPartition(manifest, clients, _read_split(base / "test"))
