"""``fedunlearn check-data``: what a scenario's data looks like to the pipeline, before a deletion
arrives — rows, classes, clients, IDs, duplicate rows, outliers by a simple score — and how long
its training will take on this machine (a few SGD steps of its model, timed, scaled to its rounds).

Read from the dataset's source as the ``prepare`` and ``partition`` stages split it (the held-out
split and the clients are per-ID hashes), so it runs before anything is prepared and changes
nothing. Whether the model memorises (the per-sample audit's power) is not measured here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedunlearn.config import Params
from fedunlearn.data.datasets import Dataset, load_source
from fedunlearn.data.partition import assign_dirichlet, assign_iid, holdout_mask

OUTLIER_SCORE = 3.5  # robust z-score (median / MAD) of a sample's distance to its class's centre
SHOWN = 5


@dataclass
class DataCheck:
    scenario: str
    dataset: str
    kind: str
    rows: int
    input_shape: tuple[int, ...]
    id_source: str
    classes: dict[str, int]
    held_out: int
    clients: list[int]  # training samples per client (HFL/DFL); empty for VFL
    duplicate_rows: int  # samples whose feature row another sample has too
    conflicting_duplicates: int  # of those, rows given different labels
    outliers: list[str]  # IDs, highest score first
    outlier_count: int
    majority_rate: float
    train_seconds: float | None  # estimated; None where not estimated (VFL)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        classes = ", ".join(f"{name}: {count}" for name, count in self.classes.items())
        out = [f"{self.scenario}: dataset {self.dataset} ({self.kind}), {self.rows} rows, input shape "
               f"{self.input_shape}, sample IDs {self.id_source}",
               f"classes ({len(self.classes)}): {classes}; the most common is {self.majority_rate:.1%} of the rows "
               "(a model must beat that: `train` refuses one that does not)",
               f"held out for testing: {self.held_out}; training samples per client: {self.clients or 'VFL parties'}",
               f"duplicate feature rows: {self.duplicate_rows}" + (f" ({self.conflicting_duplicates} with different "
                                                                   "labels)" if self.conflicting_duplicates else ""),
               f"outliers (distance to the class centre, robust z > {OUTLIER_SCORE}): {self.outlier_count}"
               + (f", e.g. {', '.join(self.outliers[:SHOWN])}" if self.outliers else "")]
        out.append("training: " + (f"about {self.train_seconds:.{0 if self.train_seconds >= 10 else 1}f} s of compute on this machine (rounds × local "
                                   "epochs × samples, timed on a few steps of the model; Prefect, MLflow and DVC add "
                                   "their own)" if self.train_seconds is not None else "not estimated for VFL"))
        return out + self.notes


def check_data(params: Params, scenario: str, root: Path) -> DataCheck:
    cfg = params.scenario(scenario)
    spec = params.datasets.get(cfg.dataset)
    data = load_source(cfg.dataset, spec, root)
    part = cfg.partition
    is_test = holdout_mask(data.sample_ids, params.seed, part.test_fraction)
    train_ids, train_labels = data.sample_ids[~is_test], data.labels[~is_test]
    clients: list[int] = []
    if cfg.setting != "vfl":
        assigned = (assign_iid(train_ids, part.num_clients, params.seed) if part.scheme == "iid" else
                    assign_dirichlet(train_ids, train_labels, part.num_clients, part.alpha, params.seed,
                                     data.num_classes))
        clients = np.bincount(assigned, minlength=part.num_clients).astype(int).tolist()
    duplicates, conflicting = duplicate_rows(data)
    scores = outlier_scores(data)
    order = np.argsort(-scores)
    flagged = [str(data.sample_ids[i]) for i in order if scores[i] > OUTLIER_SCORE]
    counts = np.bincount(data.labels, minlength=data.num_classes)
    id_source = (f"from column {spec.id_column!r}" if getattr(spec, "id_column", None) else
                 "the image paths under the folder" if getattr(spec, "source", "") == "image_folder" else
                 f"positional ({data.sample_ids[0]}, ...)")
    notes = []
    if spec is not None and getattr(spec, "source", "") in ("csv", "parquet") and not spec.id_column:
        notes.append("note: no id_column: deleting a row shifts the IDs of every later row; declare one")
    if clients and min(clients) == 0:
        notes.append("note: a client holds no training sample: lower partition.num_clients or raise alpha")
    return DataCheck(scenario, cfg.dataset, data.kind, len(data.labels), data.input_shape, id_source,
                     {name: int(c) for name, c in zip(data.class_names, counts)}, int(is_test.sum()), clients,
                     duplicates, conflicting, flagged, len(flagged), float(counts.max() / max(len(data.labels), 1)),
                     None if cfg.setting == "vfl" else estimate_training(data, cfg, int((~is_test).sum())), notes)


def duplicate_rows(data: Dataset) -> tuple[int, int]:
    """Samples whose feature row is another's too, and those among them whose labels differ."""
    rows = np.ascontiguousarray(data.features.reshape(len(data.features), -1))
    groups: dict[bytes, set[int]] = {}
    sizes: dict[bytes, int] = {}
    for row, label in zip(rows, data.labels.tolist()):
        key = row.tobytes()
        groups.setdefault(key, set()).add(label)
        sizes[key] = sizes.get(key, 0) + 1
    duplicated = [k for k, n in sizes.items() if n > 1]
    return sum(sizes[k] for k in duplicated), sum(sizes[k] for k in duplicated if len(groups[k]) > 1)


def outlier_scores(data: Dataset) -> np.ndarray:
    """Per sample: its distance to its class's mean (features standardised), as a robust z-score
    within the class (median and MAD); 0 for classes too small to say."""
    x = data.features.reshape(len(data.features), -1).astype(np.float64)
    x = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    scores = np.zeros(len(x))
    for label in np.unique(data.labels):
        rows = data.labels == label
        if rows.sum() < 5:
            continue
        distance = np.linalg.norm(x[rows] - x[rows].mean(axis=0), axis=1)
        mad = np.median(np.abs(distance - np.median(distance))) or 1e-12
        scores[rows] = 0.6745 * (distance - np.median(distance)) / mad
    return scores


def estimate_training(data: Dataset, cfg, train_samples: int, steps: int = 20) -> float:
    """Seconds of compute a federated training of ``cfg`` takes on this CPU: a few SGD steps of its
    model timed, scaled to rounds × local epochs × the training samples."""
    import torch

    from fedunlearn.device import intra_op_threads
    from models import build_model

    model = build_model(cfg.model, data.input_shape, data.num_classes, l2=cfg.l2, seed=0)
    optimiser = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    batch = min(cfg.train.batch_size, len(data.labels))
    x = torch.as_tensor(data.features[:batch])
    y = torch.as_tensor(data.labels[:batch])
    loss_fn = torch.nn.CrossEntropyLoss()
    def step() -> None:
        optimiser.zero_grad()
        loss_fn(model(x), y).backward()
        optimiser.step()

    with intra_op_threads(cfg.threads):  # as the training runs
        for _ in range(3):  # the first steps pay for allocations a training pays once
            step()
        started = time.perf_counter()
        for _ in range(steps):
            step()
        per_step = (time.perf_counter() - started) / steps
    batches = -(-max(train_samples, 1) // batch)
    return per_step * batches * cfg.train.local_epochs * cfg.train.rounds * cfg.train.client_fraction
