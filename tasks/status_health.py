"""``fedunlearn status`` as the workspace's health check: what is damaged or wrong, each with its fix.

* the ledger, the Merkle log (its heads, the published ones, every leaf against its record) and the
  receipts (``stores.transparency.workspace_damage``);
* alias ``current`` on a version that must not serve: a retired one, or one that learnt samples whose
  deletion is already forgotten exactly (the original moved back by hand after retirement);
* an erasure the batch's scan did not verify: a store still holds a deleted row or retired weights;
* versions due to retire now that still hold their weights, and those whose weights were gone before
  their retirement (recorded so, not retried).

Any health line makes ``status`` exit non-zero (``StateDamaged``'s status 4).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedunlearn.errors import StateDamaged
from fedunlearn.receipts import Receipt, read_receipts
from fedunlearn.requests.batch import load_records
from fedunlearn.requests.erasure import ErasureReport
from fedunlearn.retirement import RetirementPlan
from stores.registry import retired_batch
from stores.registry.retirement import WEIGHTS_MISSING_TAG
from stores.transparency import workspace_damage
from stores.workspace import Workspace

SHOWN_FILES = 3  # files named per unverified erasure (the batch record holds them all)


def health_lines(ws: Workspace, scenario: str, plan: RetirementPlan) -> list[str]:
    """Every problem of the workspace and the scenario's serving, each with its fix (none: healthy)."""
    return damage_lines(ws) + serving_lines(ws, scenario, plan) + erasure_lines(ws, scenario)


def damage_lines(ws: Workspace) -> list[str]:
    damage = workspace_damage(ws.root)
    if not damage:
        return []
    fix = ("`fedunlearn ledger repair` restores the ledger from the batch records" if damage.ledger else
           "restore data/transparency/ and the receipts from the DVC remote (`fedunlearn restore`); a leaf no "
           "signed head covers: remove its line from data/transparency/leaves.jsonl; `fedunlearn ledger verify` "
           "names every problem")
    return [f"**DAMAGED**: {line}" for line in damage.lines] + [
        f"fix: {fix}. Until then every command that signs or tags refuses (hold, receipt, process, repay-debt)"]


@dataclass(frozen=True)
class WrongServing:
    """Alias ``current`` on a version that must not serve: which, why, and the version that should."""

    scenario: str
    version: str
    why: str
    instead: str  # "v3", or "an exact retrain" where the receipts name none

    def line(self) -> str:
        return f"alias current is on {self.scenario} v{self.version}, which {self.why}"

    def fix(self) -> str:
        # repay-debt retrains only where a debt is owed: with none it leaves current where it is
        return (f"point current at {self.instead} (the version the receipts name last); where a retrain debt is owed, "
                f"`fedunlearn repay-debt --scenario {self.scenario}` makes an exact retrain serve instead")


def wrong_serving(ws: Workspace, scenario: str, plan: RetirementPlan) -> WrongServing | None:
    """Alias ``current`` on a version that must not serve (None: it may, or nothing serves)."""
    current = ws.registry.by_alias(scenario, "current")
    if current is None:
        return None
    from tasks.retirement import batch_facts

    number = str(current.version)
    exact = {b.batch_id for b in batch_facts(ws, scenario) if b.exact}
    should = expected_serving(read_receipts(ws.root, scenario))
    why = serving_problem(number, retired_batch(current), plan.owed.get(number, []), exact, should)
    if why is None:
        return None
    return WrongServing(scenario, number, why, f"v{should}" if should and should != number else "an exact retrain")


def serving_lines(ws: Workspace, scenario: str, plan: RetirementPlan) -> list[str]:
    """Alias ``current`` on a version that must not serve, and the version that should."""
    wrong = wrong_serving(ws, scenario, plan)
    return [] if wrong is None else [f"**WRONG VERSION SERVING**: {wrong.line()}", f"fix: {wrong.fix()}"]


def refuse_wrong_serving(ws: Workspace, scenario: str, command: str, builds: str) -> None:
    """Verify, then write: a command that would build on ``current`` (``builds``: what it would make
    of it) refuses while current is on a version that must not serve, before it writes anything."""
    from tasks.retirement import retirement_plan

    wrong = wrong_serving(ws, scenario, retirement_plan(ws, scenario))
    if wrong is not None:
        raise StateDamaged(f"{command} refused: {wrong.line()}; {builds}. Nothing was written: no request taken, "
                           f"no data version, no version, tag, leaf or tree head. Fix: {wrong.fix()}")


def serving_problem(version: str, retired_by: str | None, owed: list[str], exact: set[str],
                    expected: str | None) -> str | None:
    """Why ``version`` must not serve (None: it may): retired, or it learnt (``owed``) a batch already
    forgotten exactly (``exact``) and is not the version the receipts say serves (``expected``: a
    repayment in shards owes its source's batches on paper, yet it is the one that forgot them) — a
    version that owes only batches still owed may serve (interim)."""
    if retired_by:
        return f"was retired by {retired_by}: its weights are gone"
    done = [b for b in owed if b in exact]
    if done and version != expected:
        return (f"learnt the samples of {', '.join(done)}, whose deletion is forgotten exactly: it must not serve "
                "(moved there by hand?)")
    return None


def expected_serving(receipts: list[Receipt]) -> str | None:
    """The version the latest receipt says serves: its exact retrain, else its current."""
    for receipt in reversed(receipts):
        if receipt.exactly_forgotten is not None:
            return receipt.exactly_forgotten.version
        serving = receipt.models.get("current")
        if serving is not None:
            return serving.version
    return None


def erasure_lines(ws: Workspace, scenario: str) -> list[str]:
    """Batches whose latest erasure scan found a deleted row or retired weights in a store."""
    receipts = {r.batch_id: r for r in read_receipts(ws.root, scenario)}
    lines = []
    for record in load_records(ws.folders):
        if record.scenario != scenario:
            continue
        report = _latest_scan(record.erasure, receipts.get(record.batch_id))
        if report is None or not (report.found or report.weights_found):
            continue
        files = sorted({f for held in list(report.found.values()) + list(report.weights_found.values()) for f in held})
        lines.append(f"**ERASURE NOT VERIFIED** for {record.batch_id}: {len(report.found)} deleted sample(s)"
                     + (f" and {len(report.weights_found)} retired version(s)' weights" if report.weights_found else "")
                     + f" still in {', '.join(files[:SHOWN_FILES])}" + (" …" if len(files) > SHOWN_FILES else ""))
        lines.append("fix: delete those copies (`fedunlearn ingest --purge` clears the DVC cache and remote); the "
                     "next batch scans every store again")
    return lines


def _latest_scan(recorded: ErasureReport | None, receipt: Receipt | None) -> ErasureReport | None:
    """The receipt's scan (made after the batch registered its versions) where it reads, else the record's."""
    if receipt is not None and receipt.erasure:
        try:
            return ErasureReport.model_validate(receipt.erasure)
        except ValueError:
            pass
    return recorded


def retirement_health_lines(ws: Workspace, scenario: str, plan: RetirementPlan) -> list[str]:
    """Versions due to retire now that still hold their weights; versions whose weights were gone
    before their retirement (recorded as gone)."""
    versions = {str(v.version): v for v in ws.registry.versions(scenario)}
    lines = [f"**due to retire now**: v{n} ({versions[n].tags.get('role', '?')}) learnt only batches forgotten "
             f"exactly ({batch} last) and still holds its weights: `fedunlearn repay-debt --scenario {scenario}` "
             "retires it" for n, batch in plan.retire.items()]
    lines += [f"v{n}: its weights were already gone when it retired (removed outside fedunlearn, recorded "
              f"{v.tags[WEIGHTS_MISSING_TAG]}): no digest of them is kept" for n, v in versions.items()
              if v.tags.get(WEIGHTS_MISSING_TAG)]
    return lines
