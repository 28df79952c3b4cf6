"""What a scenario's current data holds, and how a request resolves to sample IDs.

The catalog is the partition minus the ledger ("current training data = partition minus
ledger"): per sample ID its label and its owner (an HFL/DFL client; nobody for the held-out
test split or for VFL, where all parties share the sample IDs). A request resolves to sample
IDs grouped per client (HFL/DFL), held-out IDs, or plain shared IDs (VFL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedunlearn.data.store import PARTITIONS_DIR, read_manifest
from fedunlearn.requests.model import DeletionRequestModel, RequestKind


@dataclass
class Resolution:
    """The sample IDs a request deletes, or the problem that stops it."""

    sample_ids: list[str] = field(default_factory=list)
    clients: dict[int, list[str]] = field(default_factory=dict)
    held_out: list[str] = field(default_factory=list)
    problem: str | None = None


@dataclass
class Catalog:
    scenario: str
    dataset: str
    setting: str
    num_classes: int
    labels: dict[str, int]
    owners: dict[str, int]  # training samples of HFL/DFL clients only
    held_out: set[str]
    clients: tuple[int, ...]

    def without(self, deleted: set[str]) -> "Catalog":
        return Catalog(self.scenario, self.dataset, self.setting, self.num_classes,
                       {i: y for i, y in self.labels.items() if i not in deleted},
                       {i: c for i, c in self.owners.items() if i not in deleted},
                       self.held_out - deleted, self.clients)

    def training_ids(self) -> list[str]:
        return [i for i in self.labels if i not in self.held_out]

    def resolve(self, request: DeletionRequestModel) -> Resolution:
        """Class and client requests cover training samples only: the held-out test samples of a
        forgotten class stay, to measure that the model forgot it."""
        if request.kind is RequestKind.SAMPLE:
            unknown = [i for i in request.sample_ids if i not in self.labels]
            if unknown:
                return Resolution(problem=f"{len(unknown)} sample ID(s) are not in the current data of "
                                          f"{self.scenario} (never there, or already deleted), e.g. {unknown[:5]}")
            return self._grouped(request.sample_ids)
        if request.kind is RequestKind.CLIENT and self.setting == "vfl":
            return Resolution(problem=f"{self.scenario} is vertical (VFL): its parties share every sample ID, so "
                                      "a client request does not name samples; request the sample IDs instead")
        if request.kind is RequestKind.CLASS:
            ids = [i for i in self.training_ids() if self.labels[i] == request.label]
            what = f"class {request.label}"
        else:
            ids = [i for i, owner in self.owners.items() if owner == request.client]
            what = f"client {request.client}"
        if not ids:
            return Resolution(problem=f"{what} has no remaining training samples in {self.scenario}: "
                                      "already deleted (see data/ledger/ledger.jsonl)")
        return self._grouped(ids)

    def _grouped(self, ids: list[str]) -> Resolution:
        resolution = Resolution(sample_ids=list(ids))
        for sample_id in ids:
            if sample_id in self.held_out:
                resolution.held_out.append(sample_id)
            elif sample_id in self.owners:
                resolution.clients.setdefault(self.owners[sample_id], []).append(sample_id)
        return resolution


def _read_ids(directory: Path) -> tuple[list[str], list[int]]:
    ids = np.load(directory / "sample_ids.npy", allow_pickle=False).tolist()
    labels = np.load(directory / "labels.npy", allow_pickle=False).tolist()
    return ids, labels


def load_catalog(scenario: str, root: Path, deleted: set[str]) -> Catalog:
    """The scenario's partition on disk minus the ``deleted`` (ledger) IDs."""
    manifest = read_manifest(scenario, root)
    base = Path(root) / PARTITIONS_DIR / scenario
    labels: dict[str, int] = {}
    owners: dict[str, int] = {}
    if manifest["setting"] == "vfl":
        active = base / f"party_{manifest['parties'][-1]['party']:03d}"  # the active party holds the labels
        ids, ys = _read_ids(active)
        labels.update(zip(ids, ys))
        clients: tuple[int, ...] = ()
    else:
        clients = tuple(c["client"] for c in manifest["clients"])
        for client in clients:
            ids, ys = _read_ids(base / f"client_{client:03d}")
            labels.update(zip(ids, ys))
            owners.update(dict.fromkeys(ids, client))
    test_ids, test_labels = _read_ids(base / "test")
    labels.update(zip(test_ids, test_labels))
    catalog = Catalog(scenario, manifest["dataset"], manifest["setting"], int(manifest["num_classes"]), labels,
                      owners, set(test_ids), clients)
    return catalog.without(deleted)


def source_catalog(scenario: str, params) -> Catalog:
    """The scenario's catalog with no deletion applied, from the dataset's source, split as the
    ``partition`` stage splits it: what a lost ledger entry's request is resolved against again.
    The held-out split and the clients are per-sample hashes of the ID (``data.partition``), so a
    sample belongs where it did in every data version. Only IDs and labels are kept: no row of a
    deleted sample is written anywhere."""
    from fedunlearn.data.datasets import load_source
    from fedunlearn.data.partition import assign_dirichlet, assign_iid, holdout_mask

    cfg = params.scenario(scenario)
    data = load_source(cfg.dataset, params.datasets.get(cfg.dataset))
    ids, labels, part = data.sample_ids, data.labels, cfg.partition
    is_test = holdout_mask(ids, params.seed, part.test_fraction)
    train_ids, train_labels = ids[~is_test], labels[~is_test]
    owners: dict[str, int] = {}
    clients: tuple[int, ...] = ()
    if cfg.setting != "vfl":
        assigned = (assign_iid(train_ids, part.num_clients, params.seed) if part.scheme == "iid" else
                    assign_dirichlet(train_ids, train_labels, part.num_clients, part.alpha, params.seed,
                                     data.num_classes))
        owners = dict(zip(train_ids.tolist(), assigned.tolist()))
        clients = tuple(range(part.num_clients))
    return Catalog(scenario, cfg.dataset, cfg.setting, int(data.num_classes), dict(zip(ids.tolist(), labels.tolist())),
                   owners, set(ids[is_test].tolist()), clients)


def source_resolver(params) -> Callable[[DeletionRequestModel, set[str]], Resolution]:
    """``resolve(request, deleted)``: the request resolved against its scenario's source data without
    ``deleted`` (the IDs the other ledger entries delete); each scenario's source is read once."""
    catalogs: dict[str, Catalog] = {}

    def resolve(request: DeletionRequestModel, deleted: set[str]) -> Resolution:
        if request.scenario not in params.scenarios:
            return Resolution(problem=f"scenario {request.scenario!r} is not in params.yaml")
        if request.scenario not in catalogs:
            catalogs[request.scenario] = source_catalog(request.scenario, params)
        return catalogs[request.scenario].without(deleted).resolve(request)

    return resolve
