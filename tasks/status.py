"""Where a scenario's deletion requests stand (``fedunlearn status``; the Prefect artifact
``deletion-status-<scenario>`` each batch refreshes, '_' written '-'): pending requests with their
age and deadline, overdue ones first; the serving version and its certificate; the retrain debt;
the last batch and its verdict.

A request is pending until a batch's receipt says it was forgotten: in the inbox, or applied to
the data by a batch that has not finished unlearning yet. Its deadline is the one it names, else
``requests.deadline_days`` (params.yaml, one month: GDPR Art. 12(3)) after ``submitted_at``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from prefect.artifacts import create_markdown_artifact

from fedunlearn.receipts import Receipt, read_receipt, read_receipts
from fedunlearn.requests.batch import load_records
from fedunlearn.requests.model import utc_now
from tasks.debt import retrain_debt
from tasks.requests import read_inbox
from tasks.workspace import Workspace


@dataclass(frozen=True)
class PendingRequest:
    request_id: str
    kind: str
    submitted_at: datetime
    deadline: datetime
    where: str  # "inbox", or the batch that applied it to the data and has not unlearned it yet

    def age(self, now: datetime) -> timedelta:
        return now - self.submitted_at

    def overdue(self, now: datetime) -> bool:
        return now > self.deadline


@dataclass
class DeletionStatus:
    scenario: str
    now: datetime
    pending: list[PendingRequest]
    serving: dict[str, str] | None  # version, method, certificate, data_version of alias current
    debt: str
    last_batch: Receipt | None
    unreadable: list[str] = field(default_factory=list)  # inbox files the next batch will quarantine

    @property
    def overdue(self) -> list[PendingRequest]:
        return [p for p in self.pending if p.overdue(self.now)]

    def markdown(self) -> str:
        lines = [f"## Deletion status of {self.scenario} at {self.now:%Y-%m-%d %H:%M}Z", ""]
        if self.pending:
            overdue = len(self.overdue)
            lines += [f"**{len(self.pending)} pending request(s)**" + (f", **{overdue} OVERDUE**" if overdue else ""),
                      "", "| request | kind | submitted | age | deadline | due in | where |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {p.request_id} | {p.kind} | {p.submitted_at:%Y-%m-%d %H:%M}Z | {_span(p.age(self.now))} | "
                      f"{p.deadline:%Y-%m-%d %H:%M}Z | "
                      f"{'OVERDUE by ' + _span(self.now - p.deadline) if p.overdue(self.now) else _span(p.deadline - self.now)}"
                      f" | {p.where} |" for p in self.pending]
        else:
            lines.append("no pending requests")
        if self.unreadable:
            lines += ["", f"{len(self.unreadable)} inbox file(s) the next batch quarantines: "
                          f"{', '.join(self.unreadable)}"]
        serving = self.serving
        lines += ["", f"serving: v{serving['version']} ({serving['method']}, certificate {serving['certificate']}, "
                      f"data version {serving['data_version'][:10]})" if serving else "serving: no version has alias "
                                                                                     "`current`",
                  self.debt]
        batch = self.last_batch
        if batch is None:
            lines.append("last batch: none yet")
        else:
            verdict = batch.attempts[-1].gates.verdict if batch.attempts and batch.attempts[-1].gates else (
                "exact retrain" if batch.method == "retrain" else batch.outcome)
            chain = " → ".join(a.method for a in batch.attempts)
            lines.append(f"last batch: {batch.batch_id} at {batch.created_at:%Y-%m-%d %H:%M}Z, "
                         f"{len(batch.request_ids)} request(s), {chain or batch.outcome}: {verdict}, "
                         f"{'promoted' if batch.promoted else 'not promoted'}")
        return "\n".join(lines)


def _span(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours / 24:.1f} d" if abs(hours) >= 48 else f"{hours:.1f} h"


def deletion_status(ws: Workspace, scenario: str, now: datetime | None = None) -> DeletionStatus:
    """Read-only: nothing is moved, validated against the data or quarantined."""
    now = now or utc_now()
    days = ws.params.requests.deadline_days
    triage = read_inbox(ws, scenario)
    pending = [PendingRequest(p.request.request_id, p.request.kind.value, p.request.submitted_at,
                              p.request.due(days), "inbox") for p in triage.pending]
    for record in load_records(ws.folders):
        if record.scenario != scenario or read_receipt(ws.root, record.batch_id) is not None:
            continue
        pending += [PendingRequest(e.request_id, e.kind.value if e.kind else "sample", e.submitted_at or record.created_at,
                                   (e.submitted_at or record.created_at) + timedelta(days=days),
                                   f"batch {record.batch_id} (data deleted, model not yet unlearned)")
                    for e in record.requests]
    pending.sort(key=lambda p: (not p.overdue(now), p.deadline))
    current = ws.registry.by_alias(scenario, "current")
    serving = None if current is None else {
        "version": str(current.version), "method": current.tags.get("method", current.tags.get("role", "?")),
        "certificate": current.tags.get("certificate", "?"), "data_version": current.tags.get("data_version", "?")}
    receipts = read_receipts(ws.root, scenario)
    return DeletionStatus(scenario, now, pending, serving, retrain_debt(ws, scenario).line(
        ws.params.requests.max_retrain_debt), receipts[-1] if receipts else None,
        [item.name for rejection in triage.rejected for item in rejection.items])


def status_artifact_key(scenario: str) -> str:
    """``deletion-status-<scenario>``, in the letters Prefect allows in a key (a-z, 0-9, '-')."""
    return "deletion-status-" + re.sub(r"[^a-z0-9-]", "-", scenario.lower())


def publish_status(ws: Workspace, scenario: str) -> DeletionStatus:
    """The status as the Prefect artifact ``status_artifact_key`` (a new version each batch)."""
    status = deletion_status(ws, scenario)
    create_markdown_artifact(status.markdown(), key=status_artifact_key(scenario),
                             description=f"pending deletion requests and the serving model of {scenario}")
    return status
