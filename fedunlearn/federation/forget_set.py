"""What a deletion batch is to a federation: the sample IDs to forget, per client index —
resolved from client IDs, class labels, explicit sample IDs or a seeded fraction of chosen
clients' samples. In VFL the single key 0 stands for "all parties"."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: parsing a request needs no torch
    from fedunlearn.federation.local import Tensors


REQUEST_KINDS = ("sample", "class", "client")


@dataclass
class ForgetSet:
    """Sample IDs to forget, per client index. ``clients`` / ``labels`` record the subject of a
    client or class request (and the chosen clients of a fraction request). ``remembered``: the
    forget samples the source model is measured to remember (the audit's per-sample evidence), for
    a method that removes only what is remembered; None where nothing was measured (every forget
    sample then counts as remembered). It is evidence about the model, not part of the request, so
    the content ID leaves it out."""

    kind: str
    forget_ids: dict[int, np.ndarray]
    clients: list[int] | None = None
    labels: list[int] | None = None
    batch_id: str = ""
    remembered: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.kind not in REQUEST_KINDS:
            raise ValueError(f"unknown request kind {self.kind!r}; choose one of {', '.join(REQUEST_KINDS)}")
        self.forget_ids = {int(c): np.asarray(ids) for c, ids in sorted(self.forget_ids.items()) if len(ids)}
        if not self.forget_ids:
            raise ValueError(f"the {self.kind} deletion request resolves to no samples")
        if not self.batch_id:
            self.batch_id = self._content_id()
        if self.remembered is not None:
            self.remembered = np.asarray(self.remembered)

    def with_remembered(self, sample_ids: Sequence[Any]) -> "ForgetSet":
        """The same batch with ``remembered`` set to those of ``sample_ids`` it forgets."""
        forgotten = np.concatenate(list(self.forget_ids.values()))
        wanted = np.asarray(list(sample_ids), dtype=forgotten.dtype) if len(sample_ids) else forgotten[:0]
        return ForgetSet(self.kind, dict(self.forget_ids), self.clients, self.labels, self.batch_id,
                             forgotten[np.isin(forgotten, wanted)])

    def is_remembered(self, sample_ids: np.ndarray) -> np.ndarray:
        """Per sample of ``sample_ids``: whether a removal method should treat it as remembered."""
        if self.remembered is None:
            return np.ones(len(sample_ids), dtype=bool)
        return np.isin(sample_ids, self.remembered)

    @property
    def num_forget(self) -> int:
        return sum(len(ids) for ids in self.forget_ids.values())

    @property
    def affected_clients(self) -> list[int]:
        return list(self.forget_ids)

    def _content_id(self) -> str:
        """Same request content → same ID, so a re-submitted batch is recognisable in the ledger."""
        digest = hashlib.sha256(self.kind.encode())
        for client, ids in self.forget_ids.items():
            digest.update(f"|{client}:".encode() + ",".join(sorted(map(str, ids.tolist()))).encode())
        return f"batch-{digest.hexdigest()[:12]}"

    def to_dict(self) -> dict[str, Any]:
        record = {"kind": self.kind, "batch_id": self.batch_id, "clients": self.clients, "labels": self.labels,
                  "forget_ids": {str(c): ids.tolist() for c, ids in self.forget_ids.items()}}
        if self.remembered is not None:
            record["remembered"] = self.remembered.tolist()
        return record

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ForgetSet":
        remembered = data.get("remembered")
        return cls(data["kind"], {int(c): np.asarray(ids) for c, ids in data["forget_ids"].items()},
                   data.get("clients"), data.get("labels"), data.get("batch_id", ""),
                   None if remembered is None else np.asarray(remembered))

    @classmethod
    def for_clients(cls, client_indices: Sequence[int], clients: Sequence[Tensors], *,
                    batch_id: str = "") -> "ForgetSet":
        """Forget every sample of the given clients."""
        indices = _int_list(client_indices, "client")
        for c in indices:
            check_client_index(c, clients)
        return cls("client", {c: clients[c].sample_ids for c in indices}, clients=indices, batch_id=batch_id)

    @classmethod
    def for_classes(cls, labels: Sequence[int], clients: Sequence[Tensors], *, num_classes: int | None = None,
                    batch_id: str = "") -> "ForgetSet":
        """Forget every sample of the given classes, at every client."""
        labels = _int_list(labels, "class")
        if num_classes is None:
            num_classes = 1 + max((int(c.y.max()) for c in clients if len(c)), default=-1)
        out_of_range = [label for label in labels if not 0 <= label < num_classes]
        if out_of_range:
            raise ValueError(f"class label(s) {out_of_range} out of range: labels are 0..{num_classes - 1}")
        forget = {i: c.sample_ids[np.isin(c.y.cpu().numpy(), labels)] for i, c in enumerate(clients)}
        return cls("class", forget, labels=labels, batch_id=batch_id)

    @classmethod
    def for_sample_ids(cls, sample_ids: Sequence[str], clients: Sequence[Tensors], *,
                       batch_id: str = "") -> "ForgetSet":
        """Forget explicit sample IDs, wherever they are held."""
        if isinstance(sample_ids, str):  # one ID, not a sequence of characters
            sample_ids = [sample_ids]
        wanted = np.unique(np.asarray(list(sample_ids)).astype(str))
        if not len(wanted):
            raise ValueError("empty sample subject: give at least one sample ID")
        forget = {i: c.sample_ids[np.isin(c.sample_ids, wanted)] for i, c in enumerate(clients)}
        unknown = np.setdiff1d(wanted, np.concatenate([ids for ids in forget.values()]))
        if len(unknown):
            raise ValueError(f"{len(unknown)} sample ID(s) not held by any client, e.g. {unknown[:5].tolist()}")
        return cls("sample", forget, batch_id=batch_id)

    @classmethod
    def for_fraction(cls, client_indices: Sequence[int], fraction: float, clients: Sequence[Tensors], *,
                     seed: int = 0, batch_id: str = "") -> "ForgetSet":
        """Forget a seeded random ``fraction`` (at least one sample) of each chosen client's samples."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        indices = _int_list(client_indices, "client")
        forget = {}
        for c in indices:
            ids = clients[check_client_index(c, clients)].sample_ids
            count = min(len(ids), max(1, round(fraction * len(ids))))
            forget[c] = np.sort(np.random.default_rng([seed, c]).choice(ids, size=count, replace=False))
        return cls("sample", forget, clients=indices, batch_id=batch_id)


def resolve_request(kind: str, subject: Any, clients: Sequence[Tensors], *, num_classes: int | None = None,
                    batch_id: str = "") -> ForgetSet:
    """Turn a request's subject into sample IDs per client.

    ``kind="client"``: a client index or a list of them. ``kind="class"``: a label or a list of
    labels (checked against ``num_classes``). ``kind="sample"``: a list of sample IDs, or
    ``{"clients": [...], "fraction": f, "seed": s}`` for a seeded fraction of those clients' samples.
    """
    if kind == "client":
        return ForgetSet.for_clients(subject, clients, batch_id=batch_id)
    if kind == "class":
        return ForgetSet.for_classes(subject, clients, num_classes=num_classes, batch_id=batch_id)
    if kind == "sample" and isinstance(subject, Mapping):
        unexpected = set(subject) - {"clients", "fraction", "seed"}
        if unexpected or not {"clients", "fraction"} <= set(subject):
            raise ValueError("a fraction subject is {'clients': [...], 'fraction': f, 'seed': s (optional)}; "
                             f"got keys {sorted(subject)}")
        return ForgetSet.for_fraction(subject["clients"], float(subject["fraction"]), clients,
                                          seed=int(subject.get("seed", 0)), batch_id=batch_id)
    if kind == "sample":
        return ForgetSet.for_sample_ids(subject, clients, batch_id=batch_id)
    raise ValueError(f"unknown request kind {kind!r}; choose one of {', '.join(REQUEST_KINDS)}")


def _int_list(subject: Any, what: str) -> list[int]:
    values = [subject] if isinstance(subject, (int, np.integer)) else list(subject)
    if not values:
        raise ValueError(f"empty {what} subject: give at least one {what}")
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{what} subject must be integer(s), got {subject!r}")
    return sorted({int(v) for v in values})


def check_client_index(client: int, clients: Sequence[Tensors]) -> int:
    if not 0 <= client < len(clients):
        raise ValueError(f"unknown client {client}: clients are 0..{len(clients) - 1}")
    return client
