"""The values a deletion batch is as it goes through the stages of ``process-deletions``: built once
where the flow starts (``Batch``), each stage taking the whole of one and returning the next —
applied (``Batch`` with its ingest done and its deleted rows read), ``Unlearned``, ``Receipted``,
``Settled`` — beside the scenario's scope (``ScenarioScope``: the workspace the command opened).
No stage opens the workspace again or looks its batch up in the journal: what a resumed batch needs
from the stores is read once, at entry."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

import torch

from fedunlearn.batch_decisions import BatchUnlearning, RegisteredAttempt
from fedunlearn.certify.gates import PromotionGates
from fedunlearn.config import ForgettingPolicy, Runtime
from fedunlearn.receipts import Receipt
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.requests.erasure import Fingerprints
from fedunlearn.unlearning.escalation import Attempt
from stores.registry import RegisteredModel
from tasks.debt import Debt


@dataclass(frozen=True)
class Applied:
    """The ingest steps done: the batch's record as the journal now has it, and the deleted rows'
    bytes when this process read them (memory only; None when an earlier run took them)."""

    record: BatchRecord
    fingerprints: Fingerprints | None = None
    # What this process's erasure scans found clean, per set of fingerprints: the scan before the
    # receipt reads again only what changed since the scan after the ingest.
    found_clean: dict[bytes, set[tuple]] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Batch:
    """One deletion batch as every stage of ``process-deletions`` sees it: its record, the device
    chosen for the command, the forgetting policy (which tier may serve), the escalation's attempts
    in order (``chosen_by_user``: the user named them, so the source's audit does not
    reorder them), the gates, whether to retrain the reference first, the attempts an earlier run
    registered, the source model it unlearns from and the samples its lineage was trained with the
    backdoor trigger on (``poisoned``; all three read at entry), once applied, the deleted rows'
    bytes, the runtime of the unlearning attempts (``runtime``) and what the batch warns its user of
    (``warnings``)."""

    record: BatchRecord
    device: torch.device
    forgetting: ForgettingPolicy
    attempts: tuple[Attempt, ...]
    chosen_by_user: bool
    gates: PromotionGates
    retrain_reference: bool = False
    registered: Mapping[int, RegisteredAttempt] = field(default_factory=dict)
    source: RegisteredModel | None = None
    poisoned: tuple[str, ...] = ()
    fingerprints: Fingerprints | None = None
    found_clean: dict[bytes, set[tuple]] = field(default_factory=dict, compare=False, repr=False)
    runtime: Runtime = Runtime.in_process
    warnings: tuple[str, ...] = ()

    def applied(self, done: Applied) -> Batch:
        return replace(self, record=done.record, fingerprints=done.fingerprints, found_clean=done.found_clean)

    @property
    def scenario(self) -> str:
        return self.record.scenario


@dataclass(frozen=True)
class Unlearned:
    """``unlearn-and-register`` done: every attempt registered and gated, the one chosen last."""

    batch: Batch
    unlearning: BatchUnlearning


@dataclass(frozen=True)
class Receipted:
    """``promote-and-receipt`` done — or found done by a later run (``tasks.progress.unfinished_end``):
    the batch's record, its receipt and where it is written, the device its end steps compute on, and
    what the batch warned its user of."""

    record: BatchRecord
    receipt: Receipt
    path: Path
    device: torch.device
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Settled:
    """``finish-batch`` done: the batch receipted, the retrain debt left and what was done about it
    (``exact_run``), and the dataset's other scenarios still serving the deleted samples."""

    receipted: Receipted
    debt: Debt
    exact_run: str | None
    siblings_owed: tuple[str, ...] = ()
