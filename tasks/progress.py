"""The one resume point of ``process-deletions``: which batch a run owes, and how far it got.

A batch is owed until its receipt is written, and finished only once its end steps are done too
(``BatchRecord.finished_at``: log leaves and signed head published, repaid receipts marked, the
debt settled or scheduled, the status published; ``flows.finish``). How far it got is read from
the stores, never from a run's memory: the journal (``BatchRecord.status``) says whether its
ingest steps are done; the registry says which of its attempts are registered (versions tagged
``batch_id`` and ``attempt``); the receipt says its model steps are done; ``finished_at`` that
the end steps are. A run killed anywhere is picked up by the next one from exactly there:
unfinished ingest steps run, registered attempts are read back (their weights, not a new draw),
the next attempt runs, the receipt is written, the end steps run (``unfinished_end``).

A batch applied without unlearning (``fedunlearn ingest``) is owed too — unless a model was
registered on its data version since by something else than the batch (``fedunlearn retrain``):
then that model serves (alias ``current``) and the batch gets its receipt (``close_by_retrain``).
Otherwise it can be unlearned only from a version on the data before it, while the DVC cache still
holds that data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.batch_decisions import SOURCE_TAG, NoModelFits, Owed, OwedFacts, RegisteredAttempt, owed
from fedunlearn.errors import BatchCannotSucceed
from fedunlearn.receipts import Receipt, read_receipt
from fedunlearn.requests.batch import BatchRecord, BatchStatus, in_journal_order, load_records, record_path
from fedunlearn.requests.model import utc_now
from tasks.models import SOURCE_ALIASES
from stores.registry import version_ref
from stores.workspace import Workspace, cached


def attempts_registered(ws: Workspace, scenario: str, batch_id: str) -> dict[int, RegisteredAttempt]:
    """The batch's registered attempts (unlearned versions and, for an exact retrain, the retrained
    version tagged with the batch), by attempt number."""
    return {int(v.tags["attempt"]): RegisteredAttempt(version_ref(v), v.tags.get(SOURCE_TAG))
            for v in ws.registry.versions(scenario, batch_id=batch_id) if "attempt" in v.tags}


def owes_model_steps(ws: Workspace, record: BatchRecord) -> bool:
    """An unfinished ingest owes its model steps, unless the batch has its receipt: a record rebuilt
    by ``fedunlearn ledger repair`` restarts at its ledger append, and only its (idempotent) ingest
    steps run again; unlearning it anew would rewrite a receipt the log has already signed."""
    return record.status is not BatchStatus.COMPLETE and read_receipt(ws.root, record.batch_id) is None


@task(name="find-owed-batch", cache_policy=NO_CACHE)
def owed_batch(ws: Workspace, scenario: str) -> Owed:
    """What a run of ``scenario`` owes (``batch_decisions.owed``, on what the stores say); it reads
    the stores and changes nothing. The last batch is the last one the ledger applied
    (``in_journal_order``), whatever the clock said when it ran."""
    records = [r for r in in_journal_order(load_records(ws.folders), ws.ledger.entries()) if r.scenario == scenario]
    unfinished = next((r for r in records if owes_model_steps(ws, r)), None)
    last = records[-1] if records and unfinished is None else None
    receipted = last is not None and read_receipt(ws.root, last.batch_id) is not None
    asked = last is not None and not receipted  # the rest is read only when the decision needs it
    registered = {alias: v for alias in SOURCE_ALIASES if asked and (v := ws.registry.by_alias(scenario, alias))}
    on = {alias: v.tags.get("data_version") for alias, v in registered.items()}
    facts = OwedFacts(
        unfinished, last, receipted, asked and bool(ws.registry.versions(scenario, batch_id=last.batch_id)),
        ws.data_version(scenario) if asked else "", on,
        lambda: cached(ws.root, last.data_version_before),
        any(r.sibling and read_receipt(ws.root, r.batch_id) is None for r in records) if asked else False)
    try:
        return owed(facts)
    except NoModelFits as none:
        listing = ", ".join(f"{alias}=v{registered[alias].version} (data version {d})" for alias, d in on.items())
        raise BatchCannotSucceed(
            f"the data of {scenario} moved on to data version {facts.current} (by {none.last.batch_id}, applied "
            f"without unlearning) and no registered model can be unlearned to it: " +
            ("the data before that batch is no longer in the DVC cache (purged)" if none.purged
             else f"no version is on the data before it ({listing or 'none registered'})") +
            f". Register a model on the current data version with `fedunlearn retrain --scenario {scenario}`, then "
            f"run `fedunlearn process --scenario {scenario}` again") from None


@dataclass(frozen=True)
class Unfinished:
    """A batch an earlier run receipted and did not finish: its record and its receipt."""

    record: BatchRecord
    receipt: Receipt


@task(name="find-unfinished-end", cache_policy=NO_CACHE)
def unfinished_end(ws: Workspace, scenario: str) -> Unfinished | None:
    """The scenario's last receipted batch (in the ledger's order) when its end steps are not recorded
    as done: a run killed after the receipt left them. Only the last one can be: every run finishes
    it before it starts another batch. Reads the stores, changes nothing."""
    records = [r for r in in_journal_order(load_records(ws.folders), ws.ledger.entries()) if r.scenario == scenario]
    for record in reversed(records):
        receipt = read_receipt(ws.root, record.batch_id)
        if receipt is not None:
            return None if record.finished_at is not None else Unfinished(record, receipt)
    return None


def mark_finished(ws: Workspace, batch_id: str) -> BatchRecord:
    """The batch's end steps are all done: recorded in its journal (read back from disk, so nothing
    another step wrote to it is lost), durably, last."""
    path = record_path(ws.folders, batch_id)
    record = BatchRecord.model_validate(json.loads(path.read_bytes()))  # as ``read_records`` reads it
    return record.model_copy(update={"finished_at": utc_now()}).save(ws.folders)
