"""The decisions about a scenario's retrain debt, beside the per-shard debt (``shard_debt``): what a
batch does about the debt once its receipt is written (repay, repay what is due, schedule or
nothing), when the latest safe start has passed, which version repays earlier batches, which
reference a data version keeps, whether a retrain closes the batches applied without unlearning,
and which racing exact retrain serves instead of an interim version. Plain functions of plain
values, checked in ``tests/test_batch_decisions.py`` without Prefect or a workspace.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Mapping, Sequence

from fedunlearn.certify.tiers import repay_now
from fedunlearn.receipts import NO_MODEL, Receipt
from fedunlearn.unlearning.escalation import is_exact_retrain


class DebtAction(str, Enum):
    """What a batch does about the retrain debt once its receipt is written."""

    repay = "repay"  # now, all of it: past ``requests.max_retrain_debt``
    repay_due = "repay-due"  # now, what is due: a latest safe start has come (a federation in shards: its shards)
    schedule = "schedule"  # a run of the repaying deployment at its latest safe start
    nothing = "nothing"  # nothing is owed


def debt_action(owed_requests: int, max_requests: int, start_by: datetime | None, now: datetime) -> DebtAction:
    """The retrain debt after a batch: ``owed_requests`` forgotten only approximately, against the
    most ``requests.max_retrain_debt`` allows; ``start_by`` the latest safe start of its exact retrain
    (None: nothing due)."""
    if owed_requests > max_requests:
        return DebtAction.repay
    if repay_now(start_by, now):
        return DebtAction.repay_due
    return DebtAction.nothing if start_by is None else DebtAction.schedule


def repaying_version(receipt: Receipt, current: str | None) -> str | None:
    """The version whose exact forgetting repays the earlier batches' retrain debt once ``receipt``'s
    batch serves it: the batch's own exact retrain, or one on its data version registered meanwhile
    that serves instead (``exactly_forgotten`` by it) — while it is still ``current``. None otherwise
    (an interim or formal version, no model, or ``current`` moved on since)."""
    serving = receipt.models.get("current")
    if serving is None or serving.version != current:
        return None
    done = receipt.exactly_forgotten
    exact = is_exact_retrain(receipt.method) or (done is not None and done.version == serving.version)
    return serving.version if exact and receipt.outcome != NO_MODEL else None


def late_start(start_by: datetime | None, now: datetime) -> datetime | None:
    """The latest safe start of the exact retrain that repays the debt, once it has passed: from then
    on a schedule cannot be trusted to serve in time (none runs without a served deployment), so
    whoever finds it repays at once or says so. None while there is time, or nothing is owed."""
    return start_by if repay_now(start_by, now) else None


def reference_to_reuse(retrained: Sequence[str]) -> str | None:
    """The reference a data version already has (the last of its ``retrained`` versions), which a
    retrain keeps: retraining is deterministic for a seed, so a second would be the same model. None:
    the data version has none, train it."""
    return max(retrained, key=int) if retrained else None


def retrain_closes_open(retrained_on: str, current: str, open_batches: int) -> bool:
    """A retrain closes the batches applied without unlearning only while it is on the current data
    version and some are still open: a batch that held the lock meanwhile moved the data, or closed
    them, and then the retrain is a reference, nothing more."""
    return retrained_on == current and open_batches > 0


def racing_retrain(retrained: Mapping[str, str | None], batch_id: str) -> str | None:
    """An exact retrain on the batch's data version that the batch did not make (``retrained``: version
    → the batch it was made for; ``fedunlearn retrain`` while the batch ran makes one for none). It
    forgets exactly what the batch's interim version forgets approximately, so it serves instead and
    the batch owes nothing; the batch's own reference (``--retrain``) stays a reference."""
    others = [version for version, made_for in retrained.items() if made_for != batch_id]
    return max(others, key=int) if others else None


__all__ = ["DebtAction", "debt_action", "repaying_version", "late_start", "reference_to_reuse", "retrain_closes_open",
           "racing_retrain"]
