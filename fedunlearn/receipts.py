"""Receipts: one per processed deletion batch — what was forgotten, on which data and model
versions, with which guarantee, whether the new version was promoted, and at what cost.

``data/receipts/<batch_id>.json`` (the process flow also logs it as an MLflow artifact of the
unlearned version's run). Pure: pydantic and JSON, no orchestration.

The metrics per model are ``evaluation.records.VersionMetrics`` (the keys every registered
version's run carries); the gates are ``certify.gates.GateOutcome`` with every check's verdict
and interval.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fedunlearn.benchmark.report import markdown_table
from fedunlearn.certify.certificate import EXACT_RETRAIN, FORMAL, GUARANTEES, NOT_CERTIFIED
from fedunlearn.certify.gates import NO_OP_CHECK, GateCheck, GateOutcome
from fedunlearn.errors import StateDamaged
from fedunlearn.evaluation.records import VERSION_METRICS
from fedunlearn.evaluation.uncertainty import VACUOUS_MARGIN
from fedunlearn.requests.erasure import SourceErasure
from fedunlearn.requests.folders import RECEIPTS_DIR, write_text_atomic
from fedunlearn.requests.model import utc_now

UNLEARNED = "unlearned"  # an unlearned version was registered (promoted or not: see the gates)
NO_MODEL = "no model"  # the batch left nothing to train on: alias current removed, nothing serves


class ModelRef(BaseModel):
    """A registered model version."""

    version: str
    role: str
    data_version: str | None = None
    run_id: str | None = None


class EscalationStep(BaseModel):
    """One step of the batch's escalation: a method run (or exact retrain), the version it
    registered, its certificate class and, when it was gated, the gates' outcome."""

    model_config = ConfigDict(ser_json_inf_nan="null")

    attempt: int
    method: str
    options: dict[str, Any] = Field(default_factory=dict)
    version: ModelRef | None = None
    certificate: str | None = None
    gates: GateOutcome | None = Field(None, description="None: not gated (exact retrain, or nothing to unlearn)")
    metrics: dict[str, float | None] = Field(default_factory=dict)
    note: str = ""
    cost_split: dict[str, float] = Field(default_factory=dict, description=(
        "where the attempt's FLOPs went: the method's own parts (or 'method' where it does not split "
        "them), then 'evaluation' and 'audit' (forward passes of judging it); empty where not counted"))

    @property
    def passed(self) -> bool:
        return self.gates is None or self.gates.passed


class ExactForgetting(BaseModel):
    """When the batch's requests were forgotten exactly: an exact retrain on a data version without
    them became ``current`` (repaying the retrain debt an approximate method left)."""

    at: datetime
    version: str
    by: str


# The cost columns' short names: the receipt's two tables fit the Prefect UI's artifact pane at 1400 px.
SHORT_COST = {"wall_seconds": "seconds", "flops": "FLOPs", "comm_bytes": "bytes"}


def model_cell(name: str, ref: ModelRef) -> str:
    """``source v1 (original)``: the model's part in the batch, its version, and its role where that
    says more (a batch's source may be an earlier batch's unlearned version)."""
    return f"{name} v{ref.version}" + (f" ({ref.role})" if ref.role != name else "")


class Receipt(BaseModel):
    """What one deletion batch did to the data and to the model registry."""

    model_config = ConfigDict(ser_json_inf_nan="null")  # strict JSON: a metric nobody measured is null

    batch_id: str
    scenario: str
    created_at: datetime = Field(default_factory=utc_now)
    request_ids: list[str]
    deleted_samples: int = Field(description="sample IDs the ledger removed (held-out test samples included)")
    forgotten_per_client: dict[str, int] = Field(description="training samples unlearned, per client index")
    data_version_before: str
    data_version_after: str
    outcome: str = Field(UNLEARNED, description=f"{UNLEARNED!r}, or {NO_MODEL!r} when the batch deleted every "
                                                 "training sample")
    method: str | None = None
    models: dict[str, ModelRef | None] = Field(
        description="original, source (the version unlearned from), unlearned (the version promoted: an unlearned "
                    "one, or the exact retrain an escalation ended with), retrained (reference, if any), current "
                    "(alias 'current' after the batch)")
    certificate: dict[str, Any] | None = None
    gates: GateOutcome | None = None
    attempts: list[EscalationStep] = Field(default_factory=list, description="the escalation chain, in order; the "
                                                                            "last one is the version promoted")
    promoted: bool = Field(description="alias 'current' moved to a version of the batch's new data version")
    metrics: dict[str, dict[str, float | None]] = Field(description="per model (source, unlearned, retrained)")
    costs: dict[str, Any] = Field(description="wall seconds, FLOPs and bytes per model; speed-up vs retrain")
    erasure: dict[str, Any] | None = None
    exactly_forgotten: ExactForgetting | None = Field(None, description="set when an exact retrain repaid the batch's "
                                                                       "approximate forgetting")
    exact_shards: str | None = Field(None, description="a federation in shards: the shards the exact retrain that "
                                     "forgot the batch retrained from scratch, and why the others are untouched")
    shards_repaid: dict[str, str] = Field(default_factory=dict, description="a federation in shards repaid one "
                                          "shard at a time: each touched shard retrained from scratch since, and the "
                                          "version that retrained it; exactly_forgotten once every touched shard is")
    forgetting: str | None = Field(None, description="the tier the promoted version forgets on: 'interim' "
                                   "(approximate; an exact retrain is owed by exact_due), 'exact' or 'formal'")
    policy: str | None = Field(None, description="the forgetting policy the batch ran under: 'interim' or 'strict'")
    deadlines: dict[str, datetime] = Field(default_factory=dict, description="each request's deadline (UTC)")
    exact_due: datetime | None = Field(None, description="interim: when exact forgetting is due (the earliest "
                                                         "deadline; ISO 8601 UTC)")
    exact_start_by: datetime | None = Field(None, description="interim: the latest safe time to start the exact "
                                            "retrain that repays it (exact_due less the last retrain's duration × "
                                            "requests.exact_safety_factor, less requests.exact_margin_hours)")
    source_gates: GateOutcome | None = Field(None, description="the source model (no unlearning) judged by the same "
                                             "checks, its audit included: what the batch's checks could measure")
    batch_record: str = Field(description="the ingest journal of this batch, relative to the workspace")
    siblings: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="the other scenarios of the dataset whose models learnt the deleted "
        "samples: per scenario, the batch that owes their forgetting there (owed_by), the version serving on them "
        "(serving: it stops serving the data once that batch is receipted) and, once it is, the version that "
        "forgot them (forgotten_by)")
    applied_by: list[str] = Field(default_factory=list, description="a sibling scenario's batch: the batches that "
                                  "applied these deletions under another scenario of the same dataset")
    retired: list[str] = Field(default_factory=list, description="the versions that learnt these requests' samples "
                               "and were retired once they were exactly forgotten: weights deleted, record kept")
    held: dict[str, str] = Field(default_factory=dict, description="versions that learnt these requests' samples and "
                                 "keep their weights on purpose (`fedunlearn hold`): version -> the hold's reason")

    @property
    def source_erasure(self) -> SourceErasure | None:
        """What became of the user's source file (None: a built-in, or a source outside the workspace)."""
        found = (self.erasure or {}).get("source")
        return SourceErasure.model_validate(found) if found else None

    @property
    def erasure_pending(self) -> bool:
        """The deleted rows are still in the user's source, for the user to delete (until a rescan)."""
        source = self.source_erasure
        return source is not None and source.pending

    @property
    def guarantee(self) -> str | None:
        """The certificate's class (``certify.certificate.GUARANTEES``) as the receipt records it."""
        return (self.certificate or {}).get("guarantee")

    def markdown(self) -> str:
        """A summary for people: the Prefect artifact and ``fedunlearn process`` print it."""
        models = self.models
        if self.outcome == NO_MODEL:
            return "\n\n".join([f"## Deletion batch {self.batch_id} ({self.scenario})",
                                 f"{len(self.request_ids)} request(s) deleted every training sample: data version "
                                 f"{self.data_version_before} → {self.data_version_after}; no model can be trained on "
                                 "what is left, alias `current` removed.", self.erasure_line()])
        rows = [{"model": model_cell(name, models[name]), **self.metrics.get(name, {}),
                 **{short: self.metrics.get(name, {}).get(key) for key, short in SHORT_COST.items()}}
                for name in ("source", "unlearned", "retrained") if models.get(name)]
        checks = gate_rows(self.gates, self.interim_decided())
        return "\n\n".join([
            f"## Deletion batch {self.batch_id} ({self.scenario})",
            f"{len(self.request_ids)} request(s): {', '.join(self.request_ids)}; {self.deleted_samples} sample IDs "
            f"deleted; data version {self.data_version_before} → {self.data_version_after}.",
            f"Method `{self.method}`, certificate **{self.guarantee}**; "
            + self.gates_verdict_line(),
            f"{self.serve_line()}.",
            *filter(None, [self.chain(), self.unmeasured_line(), self.source_line()]),
            markdown_table(rows, ("model", *(SHORT_COST.get(k, k) for k in VERSION_METRICS))),
            markdown_table(checks, GATE_COLUMNS), self.erasure_line(), *filter(None, [self.retirement_line()])])

    def gates_verdict_line(self) -> str:
        """The gates' verdict in the reading that decided: the interim tier's where it judged the
        version, the strict one otherwise (one verdict per check: never a strict ``fail`` beside an
        interim ``may serve``)."""
        if self.gates is None:
            return "not gated."
        if self.interim_decided() and self.gates.interim is not None:
            return (f"gates ({self.gates.policy}), interim reading: **"
                    + ("may serve" if self.gates.interim else "held back") + "**.")
        return f"gates ({self.gates.policy}) **{self.gates.verdict}**."

    def interim_decided(self) -> bool:
        """Whether the interim tier's reading decided the batch's version: it serves on that tier, or
        the interim policy held it back."""
        return self.forgetting == "interim" or (not self.promoted and self.policy != "strict")

    def serve_line(self) -> str:
        """Where alias ``current`` went and why, on one line: the version and the reason it may serve
        (its tier, what its checks said, what is owed and by when), or the reason it did not move."""
        return f"{self.promotion()}: {self.serve_reason()}"

    def promotion(self, arrow: str = "→") -> str:
        models = self.models
        if self.outcome == NO_MODEL:
            return "alias `current` removed"
        if self.promoted:
            return f"alias `current` {arrow} v{models['unlearned'].version}"
        return "alias `current` NOT moved" + (f" (stays at v{models['current'].version})" if models.get("current")
                                              else "")

    def serve_reason(self) -> str:
        """Why the batch's version serves on its tier, or why it does not serve."""
        gates = self.gates
        if self.outcome == NO_MODEL:
            return "no training sample is left to train a model on"
        if not self.promoted:
            held = (gates.held_back or [f"{c.name} {c.verdict}" for c in gates.deciding_checks(self.policy != "strict")
                                        if c.verdict != "pass"] if gates else [])
            # Under the strict policy a version the interim tier would take still needs every check to pass.
            strict = "strict policy, only a pass serves: " if self.policy == "strict" and gates and not gates.held_back \
                else ""
            return "held back — " + strict + ("; ".join(held) or "no version of the batch passed")
        if self.forgetting in ("exact", "formal"):
            return ("an exact retrain without the deleted samples: nothing owed" + self.shards_note()
                    if self.forgetting == "exact" else
                    f"certificate **{self.guarantee}** proves the forgetting: nothing owed") + self.retired_clause()
        read = gates.deciding_checks(self.forgetting == "interim") if gates else []
        inconclusive = [c.name for c in read if c.verdict == "inconclusive"]
        checks = ("not gated" if gates is None else "every check passed" if not inconclusive else
                  f"no check failed ({', '.join(inconclusive)} inconclusive)")
        if self.forgetting != "interim":
            return checks
        return f"serves on the **interim** tier — {checks}; {self.exact_owed()}"

    def exact_owed(self) -> str:
        """Interim: when exact forgetting is due, when its retrain must start, and whether it was done."""
        due = f"exact forgetting due by {self.exact_due:%Y-%m-%d %H:%M}Z" if self.exact_due else "exact forgetting owed"
        start = f" ({self.start_by_clause()})" if self.exact_start_by else ""
        done = self.exactly_forgotten
        return due + (f" — forgotten exactly at {done.at:%Y-%m-%d %H:%M}Z by v{done.version} ({done.by})"
                      + self.shards_note() + self.retired_clause() if done else start + self.shards_note())

    def start_by_clause(self) -> str:
        """The latest safe start of this batch's own exact retrain, named as this batch's: the retrain
        debt's (``flows.finish``) is the earliest over every batch owed, and may come sooner."""
        return f"this batch's latest safe start for the exact retrain: {self.exact_start_by:%Y-%m-%d %H:%M}Z"

    def retired_clause(self) -> str:
        """``; versions retired: v1, v2`` for the exact statement, or nothing."""
        return f"; versions retired: {', '.join('v' + v for v in self.retired)}" if self.retired else ""

    def shards_note(self) -> str:
        """``; shard(s) … retrained …`` where a federation in shards was retrained exactly, else nothing."""
        return f"; {self.exact_shards}" if self.exact_shards else ""

    def unmeasured_line(self) -> str:
        """Interim: what the batch's checks could not measure (the tier's caveat)."""
        if self.forgetting != "interim" or not self.promoted:
            return ""
        return "Not measurable: " + "; ".join((self.gates.unmeasured if self.gates else []) or
                                                ["every check measured"]) + "."

    def tier_line(self) -> str:
        """The tier of forgetting in one line: interim (what was not measurable, when exact is due) or exact."""
        if not self.forgetting:
            return ""
        if self.exactly_forgotten is not None:
            done = self.exactly_forgotten
            exact = (f"forgotten exactly at {done.at:%Y-%m-%d %H:%M}Z by v{done.version} ({done.by})"
                     + self.shards_note() + self.retired_clause())
            return f"Forgetting: **{self.forgetting}**, then {exact}" + (
                f"; due {self.exact_due:%Y-%m-%d %H:%M}Z" if self.exact_due else "") + "."
        if self.forgetting != "interim":
            return f"Forgetting: **{self.forgetting}** (nothing owed){self.retired_clause()}."
        unmeasured = "; ".join((self.gates.unmeasured if self.gates else []) or ["every check measured"])
        when = f" ({self.start_by_clause()})" if self.exact_start_by else ""
        return (f"Forgetting: **interim** — exact forgetting due by {self.exact_due:%Y-%m-%d %H:%M}Z{when}"
                f"{self.shards_note()}. Not measurable: {unmeasured}.")

    def retirement_line(self) -> str:
        """The versions that learnt the requests: retired (weights deleted), and any held on purpose."""
        parts = []
        if self.retired:
            parts.append("Versions that learnt these samples, retired (weights deleted, records kept): "
                         + ", ".join(f"v{v}" for v in self.retired) + ".")
        if self.held:
            parts.append("HELD (weights kept on purpose, `fedunlearn hold`): "
                         + "; ".join(f"v{v}: {reason}" for v, reason in self.held.items()) + ".")
        return " ".join(parts)

    def source_line(self) -> str:
        """The source model (no unlearning) judged by the same checks: what the checks could measure."""
        if self.source_gates is None:
            return ""
        checks = ", ".join(f"{c.name} {c.verdict}" + (f" ({c.value:.3g})" if isinstance(c.value, float) else "")
                           for c in self.source_gates.checks if c.name != "certificate")
        return f"Source model v{self.models['source'].version} (no unlearning), same checks: {checks}."

    def chain(self) -> str:
        """The escalation in one line: every attempt and how its gates ended."""
        steps = [f"{a.attempt + 1}. `{a.method}`" + (f" v{a.version.version}" if a.version else "")
                 + f" ({a.gates.verdict if a.gates else a.note or 'not gated'})" for a in self.attempts]
        return "Attempts: " + " → ".join(steps) if steps else ""

    def erasure_line(self) -> str:
        """The erasure scan in one line: the stores scanned and what still holds a deleted row."""
        report = self.erasure or {}
        stores = report.get("stores", [])
        scanned = ", ".join(s["name"] for s in stores if s["in_scope"]) or "none"
        skipped = "; ".join(f"{s['name']} ({s['note']})" for s in stores if not s["in_scope"])
        source = SourceErasure.model_validate(report["source"]) if report.get("source") else None
        if source is not None and source.pending:
            verdict = f"Erasure **PENDING** at the user's source ({source.line()}); the stores {scanned} hold no deleted row"
        elif report.get("verified") or (source is not None and source.cleared_at and not report.get("found")):
            verdict = f"Erasure **verified** in {scanned}" + (f"; {source.line()}" if source else "")
        elif report.get("found"):
            held = "; ".join(f"{s['name']}: {', '.join(s['found'][:3])}" for s in stores if s.get("found"))
            verdict = f"Erasure **NOT verified**: deleted rows are still in {held}"
        else:
            verdict = "Erasure **not verifiable**: no deleted row could be recognised"
        return verdict + (f"; not scanned: {skipped}" if skipped else "") + "."


def _interval(bounds: list[float] | None) -> str:
    return f"[{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else ""


# The gate table's columns, short: at a 1400 px window the Prefect UI leaves the receipt the width between
# its side panels (tests/test_receipts.py holds the table to it). CI: the check's confidence interval.
GATE_COLUMNS = ("gate", "value", "CI", "n", "limit", "result")
# String values too long for a table cell, said shorter (the receipt's JSON keeps the full text).
SHORT_VALUES = {NO_OP_CHECK: "source passes too"}


def allowed_certificates(allowed: list[str]) -> str:
    """The certificate row's limit in few words (the receipt's JSON lists the classes)."""
    excluded = [g for g in GUARANTEES if g not in allowed]
    if not excluded:
        return "any"
    if excluded == [NOT_CERTIFIED]:
        return "any certified"
    return f"any but {', '.join(excluded)}" if len(excluded) < len(allowed) else ", ".join(allowed)


def gate_rows(gates: GateOutcome | None, interim_tier: bool = False) -> list[dict[str, Any]]:
    """The receipt's gate table, one row per check: value, confidence interval, sample size, limit —
    as the tier that decided read them (``interim_tier``: the interim reading)."""
    return [{"gate": c.name, "value": SHORT_VALUES.get(c.name, c.value) if isinstance(c.value, str) else c.value,
             "CI": _interval(c.interval), "n": c.n, "result": c.verdict if c.verdict != "fail" else "FAIL",
             "limit": _limit(c)}
            for c in (gates.deciding_checks(interim_tier) if gates else [])]


def _limit(check: GateCheck) -> float | str | None:
    """A check's limit as the table shows it: a band around chance that holds every AUC is none."""
    if isinstance(check.limit, list):
        return allowed_certificates(check.limit)
    if check.rule_within and check.limit is not None and check.limit >= VACUOUS_MARGIN:
        return NO_LIMIT_AT_THIS_SIZE
    return check.limit


NO_LIMIT_AT_THIS_SIZE = "none at this n"


EXACT_GUARANTEES = (EXACT_RETRAIN, FORMAL)  # what needs no exact retrain later


def owes_retrain(receipt: Receipt) -> bool:
    """Whether the batch was forgotten only approximately and no exact retrain has repaid it yet."""
    guarantee = receipt.guarantee
    approximate = receipt.forgetting == "interim" if receipt.forgetting else guarantee not in EXACT_GUARANTEES
    return receipt.outcome == UNLEARNED and approximate and receipt.exactly_forgotten is None


def parse_receipt(content: str | bytes, where: str | Path) -> Receipt:
    """The receipt ``content`` holds; ``StateDamaged`` naming ``where`` (its file) when it is not one
    (cut short, edited by hand), not pydantic's "validation error for Receipt" that names no file."""
    try:
        return Receipt.model_validate_json(content)
    except UnicodeDecodeError:
        raise StateDamaged(f"{where} is not a readable receipt (not UTF-8): restore it from the DVC remote "
                           "(`fedunlearn restore`) or a backup, then run the command again") from None
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"])
        raise StateDamaged(f"{where} is not a readable receipt ({f'{field}: ' if field else ''}{first['msg']}): "
                           "restore it from the DVC remote (`fedunlearn restore`) or a backup, then run the command "
                           "again") from None


def load_receipt(path: Path) -> Receipt:
    return parse_receipt(path.read_bytes(), path)


def read_receipts(root: Path, scenario: str) -> list[Receipt]:
    """Every receipt of ``scenario``, oldest first."""
    receipts = [load_receipt(p) for p in (Path(root) / RECEIPTS_DIR).glob("*.json")]
    return sorted((r for r in receipts if r.scenario == scenario), key=lambda r: r.created_at)


def receipt_path(root: Path, batch_id: str) -> Path:
    return Path(root) / RECEIPTS_DIR / f"{batch_id}.json"


def write_receipt(root: Path, receipt: Receipt) -> Path:
    """Written atomically: a reader sees no receipt or the whole of it."""
    path = receipt_path(root, receipt.batch_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, receipt.model_dump_json(indent=2) + "\n")
    return path


def read_receipt(root: Path, batch_id: str) -> Receipt | None:
    path = receipt_path(root, batch_id)
    return load_receipt(path) if path.is_file() else None
