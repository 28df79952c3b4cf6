"""Where a scenario's deletion requests stand (``fedunlearn status``; the Prefect artifact
``deletion-status-<scenario>`` each batch refreshes, '_' written '-'): every request as pending,
interim or exact with its deadline, overdue ones first; the serving version, its certificate and
tier; the retrain debt; the last batch and its verdict.

A request is *pending* until a batch's receipt says it was forgotten: in the inbox, or applied to
the data by a batch that has not finished unlearning yet. It is *interim* while an approximate
version forgot it and no exact retrain has repaid that yet, *exact* once an exact retrain (or a
``formal (ε,δ)`` version) did. Its deadline is the one it names, else ``requests.deadline_days``
(params.yaml, one month: GDPR Art. 12(3)) after ``submitted_at``; a pending or interim request past
it is overdue — exact forgetting is what the deadline asks for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import httpx
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterState,
                                            FlowRunFilterStateType)
from prefect.client.schemas.objects import StateType
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

from fedunlearn.certify.tiers import tier_reading
from fedunlearn.certify.tiers import repay_now
from fedunlearn.receipts import Receipt, owes_retrain, read_receipts
from fedunlearn.requests.batch import BatchRecord, BatchStatus, load_records
from fedunlearn.requests.inbox import quarantined_sample_ids, read_quarantined
from fedunlearn.requests.model import utc_now
from fedunlearn.unlearning.escalation import is_exact_retrain
from stores.registry import HOLD_TAG, retired_batch
from tasks.debt import REPAY_DEPLOYMENT, repayment_time, retrain_debt
from tasks.retirement import retirement_plan
from tasks.status_health import health_lines, retirement_health_lines
from tasks.status_lines import (QuarantineLine, ScheduledRetrain, next_retrain_line, quarantine_line,
                                quarantine_lines, runs_for)
from tasks.requests import read_inbox
from tasks.siblings import open_siblings, serving_model
from stores.workspace import ScenarioScope, Workspace


PENDING, INTERIM, EXACT = "pending", "interim", "exact"
SHOWN_EXACT = 10  # exact requests listed by name (the latest); all are counted
SHOWN_QUARANTINED = 5  # quarantined requests listed (the latest); all are counted
SCHEDULED_RUNS_READ = 50  # the earliest scheduled runs of the repay deployment read, other scenarios' among them


@dataclass(frozen=True)
class PendingRequest:
    request_id: str
    kind: str
    submitted_at: datetime
    deadline: datetime
    where: str  # "inbox", the batch that applied it and has not unlearned it yet, or the batch that forgot it
    state: str = PENDING  # pending | interim | exact
    exact_at: datetime | None = None  # when it was forgotten exactly
    erasure_pending: bool = False  # its rows are still in the user's source file, for the user to delete

    def age(self, now: datetime) -> timedelta:
        return now - self.submitted_at

    def overdue(self, now: datetime) -> bool:
        """Not forgotten exactly, or not erased, by its deadline (still owed, or repaid too late)."""
        return ((now if self.erasure_pending else self.exact_at) or now) > self.deadline

    def owed(self) -> bool:
        return self.state != EXACT or self.erasure_pending

    def shown_state(self) -> str:
        """The state as the table shows it: never ``exact`` beside an erasure still pending."""
        if not self.erasure_pending:
            return self.state
        return "erasure pending" if self.state == EXACT else f"{self.state}, erasure pending"


@dataclass
class DeletionStatus:
    scenario: str
    now: datetime
    pending: list[PendingRequest]
    serving: dict[str, str] | None  # version, method, certificate, data_version of alias current
    debt: str
    last_batch: Receipt | None
    unreadable: list[str] = field(default_factory=list)  # inbox files the next batch will quarantine

    forgotten: list[PendingRequest] = field(default_factory=list)  # interim and exact
    repay_by: datetime | None = None  # the latest safe start of the exact retrain the debt is owed, once passed
    exact_due: datetime | None = None  # when that retrain must serve: the earliest deadline it repays
    quarantined: list[QuarantineLine] = field(default_factory=list)  # the latest, their reasons without sample IDs
    quarantined_count: int = 0  # every file in quarantine/
    next_retrain: ScheduledRetrain | None = None  # what Prefect has scheduled; None: the debt is nothing
    start_by: datetime | None = None  # the latest safe start of the exact retrain the debt is owed
    siblings: list[str] = field(default_factory=list)  # forgetting owed across the dataset's scenarios (sibling_lines)
    retirement: list[str] = field(default_factory=list)  # versions pending retirement, held, retired (retirement_lines)
    health: list[str] = field(default_factory=list)  # damage and wrong serving, each with its fix (status_health)
    source_erasure: list[str] = field(default_factory=list)  # rows the user must delete from their source

    @property
    def erasure_pending(self) -> bool:
        """A batch's deleted rows are still in the user's source file (``fedunlearn rescan`` checks again)."""
        return bool(self.source_erasure)

    def repayment_warning(self) -> str | None:
        """Said before the deadline, while a repayment started now may still meet it: the latest safe
        start has passed, and no scheduled run can be counted on (without a served deployment none runs)."""
        if self.repay_by is None:
            return None
        due = f" to serve by {self.exact_due:%Y-%m-%d %H:%M}Z" if self.exact_due else ""
        return (f"the exact retrain that repays the retrain debt should have started by {self.repay_by:%Y-%m-%d %H:%M}Z"
                f" (its latest safe start){due}: run `fedunlearn repay-debt --scenario {self.scenario}` now (or "
                f"`fedunlearn process --scenario {self.scenario}`, which repays it)")

    @property
    def overdue(self) -> list[PendingRequest]:
        """Requests still owed (pending or interim) past their deadline: what a monitor alerts on."""
        return [p for p in self.pending + self.forgotten if p.owed() and p.overdue(self.now)]

    @property
    def late(self) -> list[PendingRequest]:
        """Requests forgotten exactly, but after their deadline."""
        return [p for p in self.forgotten if not p.owed() and p.overdue(self.now)]

    def markdown(self) -> str:
        lines = [f"## Deletion status of {self.scenario} at {self.now:%Y-%m-%d %H:%M}Z", ""]
        lines += [*self.health, ""] if self.health else []
        if self.pending:
            overdue = sum(p.overdue(self.now) for p in self.pending)
            lines += [f"**{len(self.pending)} pending request(s)**" + (f", **{overdue} OVERDUE**" if overdue else ""),
                      "", "| request | kind | submitted | age | deadline | due in | where |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {p.request_id} | {p.kind} | {p.submitted_at:%Y-%m-%d %H:%M}Z | {_span(p.age(self.now))} | "
                      f"{p.deadline:%Y-%m-%d %H:%M}Z | "
                      f"{'OVERDUE by ' + _span(self.now - p.deadline) if p.overdue(self.now) else _span(p.deadline - self.now)}"
                      f" | {p.where} |" for p in self.pending]
        else:
            lines.append("no pending requests")
        lines += self._forgotten_lines()
        lines += ["", *(f"**ERASURE PENDING**: {line}" for line in self.source_erasure)] if self.source_erasure else []
        lines += ["", *self.siblings] if self.siblings else []
        if self.unreadable:
            lines += ["", f"{len(self.unreadable)} inbox file(s) the next batch quarantines: "
                          f"{', '.join(self.unreadable)}"]
        lines += quarantine_lines(self.quarantined, self.quarantined_count)
        serving = self.serving
        lines += ["", f"serving: v{serving['version']} ({serving['method']}, certificate {serving['certificate']}, "
                      f"forgetting {serving['forgetting']}, data version {serving['data_version'][:10]})" if serving else "serving: no version has alias "
                                                                                     "`current`",
                  self.debt, *self.retirement]
        if self.next_retrain is not None:
            lines.append(next_retrain_line(self.next_retrain, self.scenario, self.start_by))
        warning = self.repayment_warning()
        if warning:
            lines.append(f"**WARNING**: {warning}")
        batch = self.last_batch
        if batch is None:
            lines.append("last batch: none yet")
        else:
            verdict = _last_reading(batch)
            chain = " → ".join(a.method for a in batch.attempts)
            lines.append(f"last batch: {batch.batch_id} at {batch.created_at:%Y-%m-%d %H:%M}Z, "
                         f"{len(batch.request_ids)} request(s), {chain or batch.outcome}: {verdict}, "
                         f"{'promoted' if batch.promoted else 'not promoted'}"
                         + (f", forgetting {batch.forgetting}" if batch.forgetting else ""))
        return "\n".join(lines)

    def _forgotten_lines(self) -> list[str]:
        interim = [p for p in self.forgotten if p.state == INTERIM]
        exact = [p for p in self.forgotten if p.state == EXACT and not p.erasure_pending]
        erasing = [p for p in self.forgotten if p.state == EXACT and p.erasure_pending]  # never counted exact
        lines = ["", f"**{len(interim)} interim** (forgotten approximately, exact forgetting owed), "
                     + (f"**{len(erasing)} erasure pending** (forgotten by the model, rows still in the source), "
                        if erasing else "")
                     + f"**{len(exact)} exact**" + (f", {len(self.late)} of them after their deadline" if self.late
                                                   else "") + (f" (the latest {SHOWN_EXACT} listed)"
                                                               if len(exact) > SHOWN_EXACT else "")]
        if not self.forgotten:
            return lines
        # Every owed or late request; of the exact ones in time, the latest few (the rest are counted above).
        on_time = sorted((p for p in exact if not p.overdue(self.now)), key=lambda p: p.exact_at, reverse=True)
        shown = list(dict.fromkeys(interim + erasing + self.late + on_time[:SHOWN_EXACT]))
        lines += ["", "| request | state | deadline | exact forgetting | batch |", "|---|---|---|---|---|"]
        for p in sorted(shown, key=lambda p: (not p.owed(), p.deadline)):
            if p.owed():
                due = (f"OVERDUE by {_span(self.now - p.deadline)}" if p.overdue(self.now)
                       else f"due in {_span(p.deadline - self.now)}")
            else:
                due = f"at {p.exact_at:%Y-%m-%d %H:%M}Z" + (" (LATE)" if p.overdue(self.now) else "")
            lines.append(f"| {p.request_id} | {p.shown_state()} | {p.deadline:%Y-%m-%d %H:%M}Z | {due} | {p.where} |")
        return lines


def _last_reading(batch: Receipt) -> str:
    """What the gates said of the batch's last attempt, on the tier that decided, as its attempts line
    reads it (``gates.tier_reading``)."""
    gates = batch.attempts[-1].gates if batch.attempts else None
    if gates is None:
        return "exact retrain" if is_exact_retrain(batch.method) else batch.outcome
    return tier_reading(gates.verdict, gates.interim, batch.forgetting == "interim")


def _span(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours / 24:.1f} d" if abs(hours) >= 48 else f"{hours:.1f} h"


def unfinished_requests(record: BatchRecord, days: int) -> list[PendingRequest]:
    """The requests of a batch with no receipt yet, and how far it got: journaled but not applied
    (an earlier run stopped before the ledger), or applied to the data but not yet unlearned."""
    state = ("data deleted, model not yet unlearned" if record.status is BatchStatus.COMPLETE
             else "in a batch, data not yet deleted")
    if record.sibling:
        state = f"data deleted by {', '.join(record.applied_by)} under another scenario, model not yet unlearned"
    return [PendingRequest(e.request_id, e.kind.value if e.kind else "sample", e.submitted_at or record.created_at,
                           e.due(days, record.created_at), f"{record.batch_id} ({state})") for e in record.requests]


def deletion_status(ws: Workspace, scenario: str, now: datetime | None = None) -> DeletionStatus:
    """Read-only: nothing is moved, validated against the data or quarantined."""
    now = now or utc_now()
    days = ws.params.requests.deadline_days
    triage = read_inbox(ws, scenario)
    receipts = read_receipts(ws.root, scenario)
    by_batch = {r.batch_id: r for r in receipts}
    in_batches, forgotten = [], []
    for record in load_records(ws.folders):
        if record.scenario != scenario:
            continue
        receipt = by_batch.get(record.batch_id)
        if receipt is None:
            in_batches += unfinished_requests(record, days)
        else:
            forgotten += forgotten_requests(record, receipt, days)
    taken = {p.request_id for p in in_batches}  # a batch not yet applied leaves its files in the inbox
    pending = [PendingRequest(p.request.request_id, p.request.kind.value, p.request.submitted_at,
                              p.request.due(days), "inbox") for p in triage.pending
               if p.request.request_id not in taken] + in_batches
    pending.sort(key=lambda p: (not p.overdue(now), p.deadline))
    current = ws.registry.by_alias(scenario, "current")
    serving = None if current is None else {
        "version": str(current.version), "method": current.tags.get("method", current.tags.get("role", "?")),
        "certificate": current.tags.get("certificate", "?"), "data_version": current.tags.get("data_version", "?"),
        "forgetting": current.tags.get("forgetting", "?")}
    debt = retrain_debt(ws, scenario)
    start_by = repayment_time(ws, scenario, debt)
    quarantined = read_quarantined(ws.folders)
    return DeletionStatus(scenario, now, pending, serving, debt.line(ws.params.requests.max_retrain_debt),
                          receipts[-1] if receipts else None,
                          [item.name for rejection in triage.rejected for item in rejection.items], forgotten,
                          start_by if repay_now(start_by, now) else None, debt.due,
                          [quarantine_line(q, quarantined_sample_ids(ws.folders, q.name))
                           for q in quarantined[:SHOWN_QUARANTINED]], len(quarantined),
                          scheduled_retrain(ws.root, scenario) if debt.receipts else None, start_by,
                          sibling_lines(ws, scenario, now), retirement_lines(ws, scenario),
                          workspace_health(ws, scenario),
                          [f"{r.batch_id}: {r.source_erasure.line()}" for r in receipts if r.erasure_pending])


def workspace_health(ws: Workspace, scenario: str) -> list[str]:
    return health_lines(ws, scenario, retirement_plan(ws, scenario))


def retirement_lines(ws: Workspace, scenario: str) -> list[str]:
    """The versions that learnt deleted samples: pending retirement (with the date their weights must
    be gone by), held on purpose (with the requests they still hold), and how many retired; those due
    now and those whose weights were gone before they retired (``status_health``)."""
    plan = retirement_plan(ws, scenario)
    versions = {str(v.version): v for v in ws.registry.versions(scenario)}
    lines = [f"**pending retirement**: v{n} ({versions[n].tags.get('role', '?')}) learnt {len(plan.owed[n])} batch(es) "
             f"not all exactly forgotten; its weights go once they are" + (f", due by {due:%Y-%m-%d %H:%M}Z" if due
                                                                          else "") for n, due in plan.pending.items()]
    lines += [f"**HELD**: v{n} ({versions[n].tags.get('role', '?')}) keeps its weights on purpose "
              f"({versions[n].tags.get(HOLD_TAG)}); it still holds {len(held)} request(s): {', '.join(held[:5])}"
              + (" …" if len(held) > 5 else "") for n, held in plan.held.items()]
    retired = [f"v{n}" for n, v in versions.items() if retired_batch(v)]
    if retired:
        lines.append(f"retired: {', '.join(retired)} (weights deleted, records kept: `fedunlearn compare`)")
    return lines + retirement_health_lines(ws, scenario, plan)


def sibling_lines(ws: Workspace, scenario: str, now: datetime) -> list[str]:
    """The forgetting owed across the scenarios of the dataset (``tasks.siblings``): what this
    scenario owes for deletions applied under another, and what the others still owe for deletions
    applied here — so that the status of each says the same about a request."""
    days, lines = ws.params.requests.deadline_days, []
    owed = open_siblings(ws, ws.scenario(scenario).dataset)
    ours = {r.batch_id for r in load_records(ws.folders) if r.scenario == scenario} if owed else set()
    for record in owed:
        due = min(record.deadlines(days).values())
        when = f"{'OVERDUE since' if due < now else 'due by'} {due:%Y-%m-%d %H:%M}Z"
        if record.scenario == scenario:
            serving = serving_model(ws, scenario)
            lines.append(f"**forgetting owed** for {len(record.requests)} request(s) applied by "
                         f"{', '.join(record.applied_by)} under another scenario of the dataset ({record.batch_id}, "
                         f"{when}): " + (f"v{serving.version} ({serving.role}) was" if serving else "its model was")
                         + f" trained on their samples; `fedunlearn process --scenario {scenario}` forgets them")
        elif set(record.applied_by) & ours:
            lines.append(f"**{record.scenario} still serves** samples that {len(record.requests)} request(s) deleted "
                         f"here ({record.batch_id}, {when}): `fedunlearn process --scenario {record.scenario}` "
                         "forgets them")
    return lines


def forgotten_requests(record, receipt: Receipt, days: float) -> list[PendingRequest]:
    """A receipted batch's requests: interim while the receipt owes an exact retrain, else exact
    (at the repayment, or at the batch for an exact or formal version)."""
    owed = owes_retrain(receipt)
    exact_at = None if owed else (receipt.exactly_forgotten.at if receipt.exactly_forgotten else receipt.created_at)
    return [PendingRequest(e.request_id, e.kind.value if e.kind else "sample", e.submitted_at or record.created_at,
                           receipt.deadlines.get(e.request_id) or e.due(days, record.created_at),
                           record.batch_id + (f" ({receipt.outcome})" if receipt.outcome != "unlearned" else ""),
                           INTERIM if owed else EXACT, exact_at, receipt.erasure_pending)
            for e in record.requests]


def scheduled_retrain(root: Path, scenario: str) -> ScheduledRetrain:
    """The next scheduled run of the served ``repay-retrain-debt`` deployment for this workspace and
    scenario, as the Prefect API in ``PREFECT_API_URL`` has it. Without that setting nothing is asked:
    the client would start a temporary server of its own, which serves no deployment."""
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        return ScheduledRetrain(unknown="no Prefect server to ask: PREFECT_API_URL is not set")
    try:
        with get_client(sync_client=True) as client:
            try:
                deployment = client.read_deployment_by_name(REPAY_DEPLOYMENT)
            except ObjectNotFound:
                return ScheduledRetrain()
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))),
                sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=SCHEDULED_RUNS_READ)
    except (OSError, httpx.HTTPError, PrefectHTTPStatusError) as err:
        return ScheduledRetrain(unknown=f"the Prefect server at {api} did not answer ({type(err).__name__})")
    times = [run.expected_start_time for run in runs
             if run.expected_start_time and runs_for(run.parameters, root, scenario)]
    return ScheduledRetrain(REPAY_DEPLOYMENT, min(times, default=None), paused=bool(deployment.paused))


def status_artifact_key(scenario: str) -> str:
    """``deletion-status-<scenario>``, in the letters Prefect allows in a key (a-z, 0-9, '-')."""
    return "deletion-status-" + re.sub(r"[^a-z0-9-]", "-", scenario.lower())


@task(name="publish-status", cache_policy=NO_CACHE)
def publish_status(scope: ScenarioScope) -> DeletionStatus:
    """The status as the Prefect artifact ``status_artifact_key`` (a new version each batch)."""
    status = deletion_status(scope.ws, scope.scenario)
    create_markdown_artifact(status.markdown(), key=status_artifact_key(scope.scenario),
                             description=f"pending deletion requests and the serving model of {scope.scenario}")
    return status
