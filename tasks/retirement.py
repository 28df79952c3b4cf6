"""Retirement of the versions that learnt deleted data, as Prefect tasks: the plan read from
the registry, the batch records and the receipts (``fedunlearn.retirement``), the weights deleted
from MLflow (``stores.registry.retirement``) and from the local stores that may hold a copy, the
receipts told which versions retired or are held, each retirement and hold logged in the Merkle log.

Run after every exact forgetting: at the end of ``repay`` (an exact retrain repaid the debt) and of
``finish_batch`` (a batch that forgot exactly). Idempotent: a run killed anywhere is completed by the
next, which finds the versions ``retiring`` and finishes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.benchmark import cache as benchmark_cache
from fedunlearn.receipts import Receipt, owes_retrain, read_receipts, write_receipt
from fedunlearn.requests import erasure
from fedunlearn.requests.batch import load_records
from fedunlearn.retirement import BatchFacts, RetirementPlan, VersionFacts, batches_from, plan_retirement
from fedunlearn.transparency.log import TransparencyLog
from fedunlearn.transparency.statements import HOLD, RETIREMENT  # noqa: F401 (the names this module gave them)
from stores.erasure import erasure_stores, prefect_store
from stores.registry import HOLD_TAG
from stores.registry.retirement import RETIRED, RETIREMENT_TAG, RETIRING
from stores.transparency import publish_tree_head, refuse_if_damaged
from stores.workspace import Workspace

# Stores whose files are the product's own scratch and caches: a copy of retired weights there is deleted.
SCRATCH_STORES = ("temporary files", "model caches", "benchmark outputs")


def version_facts(ws: Workspace, scenario: str) -> list[VersionFacts]:
    facts = []
    for v in ws.registry.versions(scenario):
        tags = v.tags
        formal = (tags.get("certificate") or "").startswith("formal")
        facts.append(VersionFacts(str(v.version), tags.get("role", "?"), tags.get("data_version"),
                                  tags.get("source_version"), tags.get("batch_id"),
                                  tags.get("forgetting") or ("formal" if formal else None), tags.get(HOLD_TAG),
                                  tags.get("retired_by") if tags.get(RETIREMENT_TAG) == RETIRED else None))
    return facts


def batch_facts(ws: Workspace, scenario: str) -> list[BatchFacts]:
    """The scenario's batches in journal order; exact once a receipt says nothing is owed."""
    receipts = {r.batch_id: r for r in read_receipts(ws.root, scenario)}
    days, facts = ws.params.requests.deadline_days, []
    for record in load_records(ws.folders):
        if record.scenario != scenario:
            continue
        receipt = receipts.get(record.batch_id)
        deadlines = record.deadlines(days)
        facts.append(BatchFacts(record.batch_id, record.data_version_before, record.data_version_after,
                                receipt is not None and not owes_retrain(receipt),
                                min(deadlines.values()) if deadlines else None, tuple(deadlines)))
    return facts


def retirement_plan(ws: Workspace, scenario: str) -> RetirementPlan:
    current = ws.registry.by_alias(scenario, "current")
    return plan_retirement(version_facts(ws, scenario), batch_facts(ws, scenario),
                           str(current.version) if current is not None else None)


@dataclass
class Retired:
    versions: dict[str, str] = field(default_factory=dict)  # version -> the batch that retired it
    benchmark_originals: dict[str, str] = field(default_factory=dict)  # artifacts/originals/<key>.pt -> batch
    copies_deleted: list[str] = field(default_factory=list)  # files of scratch stores that held retired weights
    check: erasure.ErasureReport | None = None  # every store scanned for the retired weights
    receipts: dict[str, Receipt] = field(default_factory=dict)  # batch -> its receipt as the notes rewrote it

    def line(self, scenario: str) -> str:
        if not self.versions:
            return f"{scenario}: no version to retire"
        where = "absent from every store scanned" if self.check and self.check.weights_clean else (
            "STILL in " + "; ".join(f"{v}: {', '.join(f[:3])}" for v, f in (self.check.weights_found.items()
                                                                          if self.check else [])))
        originals = (f" and {len(self.benchmark_originals)} cached benchmark original(s) trained on the deleted data"
                     if self.benchmark_originals else "")
        return (f"retired {', '.join(f'{scenario} v{v}' for v in self.versions)}{originals} (their weights deleted, "
                f"their records kept): the weights are {where}")


@task(name="retire-versions", cache_policy=NO_CACHE)
def retire_forgotten(ws: Workspace, scenario: str) -> Retired:
    """Every version whose owed batches are all exactly forgotten loses its weights (a ``retiring``
    one left by a killed run first); copies in the scratch stores go; every store is scanned for the
    weights; the receipts say which versions retired; the Merkle log records each retirement — and
    those of versions retired by a run killed before their leaf. The log, the checkpoint and the
    ledger are verified first: on damage nothing is tagged, deleted or signed."""
    refuse_if_damaged(ws.root, f"the retirement of {scenario}'s versions")
    done = Retired()
    for v in ws.registry.versions(scenario):
        if v.tags.get(RETIREMENT_TAG) == RETIRING:
            ws.registry.retire(scenario, str(v.version), v.tags["retired_by"])
            done.versions[str(v.version)] = v.tags["retired_by"]
    plan = retirement_plan(ws, scenario)
    for version, batch_id in plan.retire.items():
        ws.registry.retire(scenario, version, batch_id)
        done.versions[version] = batch_id
    done.receipts = note_on_receipts(ws, scenario, plan)
    done.benchmark_originals = retire_benchmark_originals(ws, scenario, bool(done.versions))
    if done.versions or done.benchmark_originals:
        done.copies_deleted = delete_copies(ws)
        done.check = weights_check(ws)
        print(done.line(scenario))
    log_retirements(ws, scenario)
    return done


def retire_benchmark_originals(ws: Workspace, scenario: str, retiring: bool) -> dict[str, str]:
    """The benchmark's cached originals (``artifacts/originals/``) trained on a data version whose later
    batches are all exactly forgotten: their keyed windows kept for the scans, their weights deleted
    (the cache trains again when asked). One cached before its provenance was recorded cannot say
    what it learnt: it goes with the first retirement (``retiring``) of any scenario's versions."""
    batches = batch_facts(ws, scenario)
    exact, key, gone = {b.batch_id for b in batches if b.exact}, erasure.fingerprint_key(ws.root), {}
    for cached in benchmark_cache.cached_originals(ws.root):
        if cached.scenario is None:
            by = "a retirement (no provenance recorded)" if retiring else ""
        elif cached.scenario == scenario:
            owed = batches_from(cached.data_version, batches)
            by = owed[-1] if owed and set(owed) <= exact else ""
        else:
            continue
        if not by:
            continue
        owner = f"{cached.scenario or '?'} benchmark original {cached.key}"
        state = torch.load(cached.weights, map_location="cpu", weights_only=True)
        tensors = [t.detach().contiguous().view(-1).numpy().tobytes() for t in benchmark_cache.flat_tensors(state)]
        erasure.remember_retired(ws.root, owner, erasure.weight_windows(key, owner, tensors))
        benchmark_cache.retire(cached, by)
        gone[ws.relative(cached.weights)] = by
    return gone


def delete_copies(ws: Workspace) -> list[str]:
    """Files of the scratch stores and Prefect's result storage that hold a retired version's weights."""
    windows, _ = erasure.retired_windows(ws.root, erasure.fingerprint_key(ws.root))
    matcher = erasure.WindowMatcher(erasure.fingerprint_key(ws.root), windows)
    roots = [p for s in erasure_stores(ws.root, purged=False) if s.name in SCRATCH_STORES for p in s.paths]
    roots.append(Path(prefect_results_path()))
    deleted = []
    for path in erasure.files_under([p for p in roots if p.exists()]):
        if matcher.owners_in(path.read_bytes()):
            path.unlink()
            deleted.append(ws.relative(path) if path.is_relative_to(ws.root) else str(path))
    return deleted


def prefect_results_path() -> str:
    from prefect.settings import get_current_settings

    return str(Path(get_current_settings().results.local_storage_path).expanduser())


def weights_check(ws: Workspace) -> erasure.ErasureReport:
    """Every store in scope scanned for every retired version's weights (no deleted row looked for)."""
    secret = erasure.fingerprint_key(ws.root)
    windows, other = erasure.retired_windows(ws.root, secret)
    report = erasure.verify_erasure(erasure.Fingerprints({}, {}), erasure_stores(ws.root, purged=False), ws.root,
                                    weights=erasure.WindowMatcher(secret, windows))
    report.retired_versions_not_checkable = other
    return report


def note_on_receipts(ws: Workspace, scenario: str, plan: RetirementPlan) -> dict[str, Receipt]:
    """Each receipt names the versions that learnt its requests and are retired, or held; returns
    those it rewrote, by batch."""
    versions, noted = {str(v.version): v for v in ws.registry.versions(scenario)}, {}
    for receipt in read_receipts(ws.root, scenario):
        owing = [n for n, owed in plan.owed.items() if receipt.batch_id in owed]
        retired = sorted((n for n in owing if versions[n].tags.get(RETIREMENT_TAG) in (RETIRING, RETIRED)), key=int)
        held = {n: versions[n].tags[HOLD_TAG] for n in owing if n in plan.held}
        if (retired, held) != (receipt.retired, receipt.held):
            receipt.retired, receipt.held = retired, held
            write_receipt(ws.root, receipt)
            noted[receipt.batch_id] = receipt
    return noted


def unlogged_retirements(ws: Workspace, scenario: str) -> list[str]:
    """The scenario's retired versions the Merkle log has no leaf for (a run killed after the tombstone)."""
    logged = {r.key for r in TransparencyLog(ws.root).records() if r.kind == "retirement"}
    return [str(v.version) for v in ws.registry.versions(scenario)
            if v.tags.get(RETIREMENT_TAG) == RETIRED and f"{scenario} v{v.version}" not in logged]


def log_retirements(ws: Workspace, scenario: str) -> None:
    """A leaf per retired version without one (the version, the batch, the weights' digest, read
    from its tombstone by the log's sync) under a newly signed head."""
    if unlogged_retirements(ws, scenario):
        serving = ws.registry.alias_ref(scenario, "current")  # its run carries the newest head, as a batch's does
        publish_tree_head(ws.root, serving.run_id if serving else None)


def hold_version(ws: Workspace, scenario: str, version: str, reason: str, now: datetime | None = None) -> list[str]:
    """Keep ``version``'s weights on purpose: tagged, logged in the Merkle log (the reason's words
    are the operator's; the leaf is made from the tags, so a run killed between the two is completed
    by the next signing), the receipts of the requests it holds told. Returns those requests. The
    log, the checkpoint and the ledger are verified first: on damage nothing is tagged or signed."""
    refuse_if_damaged(ws.root, f"`fedunlearn hold {version} --scenario {scenario}`")
    ws.registry.hold(scenario, version, reason)
    publish_tree_head(ws.root)
    plan = retirement_plan(ws, scenario)
    note_on_receipts(ws, scenario, plan)
    return plan.held.get(version, [])

