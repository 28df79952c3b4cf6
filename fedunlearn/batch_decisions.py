"""The decisions of a deletion batch, apart from the flow that carries them out: which model the
batch unlearns from, which route it takes (unlearn and escalate, keep the source, retrain for new
features, close without a model) and which attempts that leaves, when the escalation stops, what
it does about the retrain debt (repay, schedule or nothing), which version repays earlier batches
once its receipt is written, and one receipt builder per outcome (served, no model left, closed by
an exact retrain). Plain functions of plain values: the flows
and tasks call them, ``tests/test_batch_decisions.py`` checks every branch without Prefect or a
workspace.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Callable, Mapping, Sequence

from fedunlearn.certify.certificate import EXACT_RETRAIN, Certificate
from fedunlearn.certify.gates import GateOutcome
from fedunlearn.certify.tiers import Tier, exact_due, repay_now, tier_of
from fedunlearn.config import ForgettingPolicy
from fedunlearn.evaluation.records import Evaluation, VersionMetrics
from fedunlearn.federation.cost import Cost
from fedunlearn.receipts import NO_MODEL, EscalationStep, ExactForgetting, ModelRef, Receipt
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.unlearning.escalation import EXACT_RETRAIN_METHOD, is_exact_retrain

UNCHANGED = "unchanged"  # the method of a batch that deleted only held-out samples: nothing to unlearn
SOURCE_TAG = "source_version"


class Route(str, Enum):
    """What a batch does with its model, decided before any model work."""

    escalate = "escalate"  # unlearn, judge, escalate until an attempt may serve
    exact_only = "exact-only"  # training samples deleted, and the feature transform moved: exact retrain
    retrain_for_new_features = "retrain-for-new-features"  # only held-out samples, but the transform moved
    keep_source = "keep-source"  # only held-out samples: the model never trained on them
    no_model = "no-model"  # every training sample deleted: nothing to train or unlearn on


def route(refits_on_holdout: bool, deletes_held_out: bool, forget_samples: int | None, training_samples: int) -> Route:
    """The batch's route. ``forget_samples`` is None when the batch deletes no training sample."""
    transform_moved = refits_on_holdout and deletes_held_out
    if forget_samples is None:
        return Route.retrain_for_new_features if transform_moved else Route.keep_source
    if forget_samples >= training_samples:
        return Route.no_model
    return Route.exact_only if transform_moved else Route.escalate


@dataclass(frozen=True)
class RegisteredAttempt:
    """An attempt of the batch that an earlier run registered: its version, and the source version it
    unlearned from (its ``source_version`` tag; None for an exact retrain)."""

    ref: ModelRef
    source_version: str | None = None


def recorded_source(registered: Mapping[int, RegisteredAttempt]) -> str | None:
    """The source version an earlier run of the batch unlearned from (its registered attempts say it),
    so a resumed batch judges its attempts against the same model."""
    return next((a.source_version for a in registered.values() if a.source_version is not None), None)


@dataclass
class BatchUnlearning:
    """What unlearning a batch came to: the source, the reference, every attempt, the one chosen."""

    source: ModelRef
    source_metrics: VersionMetrics
    attempts: list[EscalationStep]
    certificate: Certificate | None  # the chosen attempt's; serialised only in the receipt
    cost: Cost
    forgotten_per_client: dict[str, int]
    reference: ModelRef | None = None
    reference_metrics: VersionMetrics | None = None
    source_gates: GateOutcome | None = None
    evaluations: dict[str, Evaluation] = field(default_factory=dict, repr=False)
    batch_flops: float | None = None  # every attempt with its judging, and the source's judging; None: not counted

    @property
    def chosen(self) -> EscalationStep:
        return self.attempts[-1]


def metrics_of(evaluation: Evaluation | None, cost: Cost | None) -> dict[str, float | None]:
    """An attempt's metrics for the receipt: NaN (not measured) as None."""
    return {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else v)
            for k, v in VersionMetrics.of(evaluation, cost).to_dict().items()}


def exact_certificate(scenario: str, batch_id: str, why: str) -> Certificate:
    """The certificate of a batch's exact retrain."""
    return retrain_certificate(f"retrained from scratch on the retained data ({why})", scenario, batch_id)


def retrain_certificate(note: str, scenario: str = "", batch_id: str = "") -> Certificate:
    """An exact retrain's certificate; ``scenario`` and ``batch_id`` where the retrain was a batch's own."""
    return Certificate(method=EXACT_RETRAIN_METHOD, guarantee=EXACT_RETRAIN, claimed=EXACT_RETRAIN,
                       scenario=scenario, batch_id=batch_id, notes=[note])


def certificate_record(certificate: Certificate | None) -> dict[str, Any]:
    """A certificate as a receipt records it. A method's, whole; an exact retrain's and an unchanged
    model's carry no numbers or assumptions, so they name only what they say: the method, the
    guarantee and (exact retrain) the claim, the batch it was made for and why."""
    if certificate is None:
        return {}
    if certificate.method == UNCHANGED:
        return {"method": UNCHANGED, "guarantee": certificate.guarantee}
    if is_exact_retrain(certificate.method):
        made_for = ({"scenario": certificate.scenario, "batch_id": certificate.batch_id} if certificate.batch_id
                    else {})
        return {"method": certificate.method, "guarantee": certificate.guarantee, "claimed": certificate.claimed,
                **made_for, "notes": list(certificate.notes)}
    return json.loads(certificate.to_json())


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


@dataclass(frozen=True)
class OwedFacts:
    """What the stores say of a scenario's batches, in the ledger's order, for ``owed``: the first
    whose ingest is unfinished; the last one, whether it has a receipt and any version registered for
    it; the current data version; the data version each source alias's model is on; whether the data
    before the last batch is still in DVC's cache (asked only when the decision needs it: the cache is
    opened to answer); whether a sibling's batch is still without a receipt."""

    unfinished: BatchRecord | None
    last: BatchRecord | None
    last_receipted: bool
    last_has_versions: bool
    current: str
    aliases_on: Mapping[str, str | None]
    before_cached: Callable[[], bool]
    sibling_open: bool


@dataclass(frozen=True)
class Owed:
    """What a run owes a scenario before it takes new requests: a ``batch`` to finish, or the alias
    whose model, registered on the current data version since the batches applied without unlearning,
    ``closes_open`` them (the caller closes them: ``close_by_retrain``), or an exact retrain that closes
    them (``retrain_open``: no model can be unlearned to the current data, and a sibling scenario's
    deletions are among them — forgetting this scenario owes without anyone having asked for a
    retrain), or nothing."""

    batch: BatchRecord | None = None
    closes_open: str | None = None
    retrain_open: bool = False  # several batches owed, a sibling's among them, and no model fits the first


class NoModelFits(Exception):
    """No registered model can be unlearned to the current data (``owed``); the caller says what to do."""

    def __init__(self, last: BatchRecord, purged: bool):
        super().__init__(last.batch_id)
        self.last, self.purged = last, purged


def owed(facts: OwedFacts) -> Owed:
    """What a run owes (``Owed``): an unfinished ingest first; then the last batch, unless it has its
    receipt or the data moved on since it; one a killed run registered a version for goes on to its
    receipt; a model on the current data serves and closes it; one on the data before it unlearns it
    while that data is cached; a sibling's batch among them asks for an exact retrain. Otherwise
    ``NoModelFits``."""
    last = facts.last
    if facts.unfinished is not None:
        return Owed(facts.unfinished)
    if last is None or facts.last_receipted or last.data_version_after != facts.current:
        return Owed()
    if facts.last_has_versions:
        return Owed(last)
    on = facts.aliases_on
    if facts.current in on.values():
        return Owed(closes_open=next(a for a, d in on.items() if d == facts.current))
    if last.data_version_before in on.values() and facts.before_cached():
        return Owed(last)
    if facts.sibling_open:
        return Owed(retrain_open=True)
    raise NoModelFits(last, purged=last.data_version_before in on.values())


def tier_fields(deadlines: dict[str, datetime], certificate: str | None, forgetting: ForgettingPolicy,
                start_by: Callable[[datetime], datetime]) -> dict:
    """The receipt's tier fields: the tier the chosen version forgets on, each request's deadline and,
    on the interim tier, when exact forgetting is due and the latest safe time to start it."""
    tier = tier_of(certificate)
    fields = {"forgetting": tier.value, "policy": forgetting.value, "deadlines": deadlines}
    if tier is Tier.interim:
        due = exact_due(deadlines.values())
        fields.update(exact_due=due, exact_start_by=start_by(due))
    return fields


def speedup(reference_seconds: float | None, chosen_seconds: float | None) -> float | None:
    """Retraining's wall time over the chosen attempt's; None when either is unknown."""
    if reference_seconds is None or not chosen_seconds or chosen_seconds <= 0:
        return None
    ratio = reference_seconds / chosen_seconds
    return None if math.isnan(ratio) else ratio


def _costs(unlearning: BatchUnlearning) -> dict[str, Any]:
    reference = unlearning.reference_metrics
    cost = unlearning.cost
    costs: dict[str, Any] = {"unlearned": {"wall_seconds": cost.wall_seconds, "flops": cost.flops,
                                           "comm_bytes": cost.comm_bytes, "split": unlearning.chosen.cost_split}}
    if reference:
        costs["retrained"] = {k: getattr(reference, k) for k in ("wall_seconds", "flops", "comm_bytes")}
    costs["speedup_vs_retrain"] = speedup(reference.wall_seconds if reference else None, unlearning.cost.wall_seconds)
    costs["batch"] = {"flops": unlearning.batch_flops, "attempts": len(unlearning.attempts),
                      "counts": "every attempt's method, evaluation and audit, and the source's evaluation and audit"}
    return costs


def batch_flops(attempts: list[EscalationStep], exact_flops: float | None, source_judging: float | None) -> float | None:
    """A batch's FLOPs: each attempt's split summed (an exact retrain's own FLOPs, ``exact_flops``,
    for the step that has none), and judging the source; None where any part was not counted."""
    total = source_judging
    for attempt in attempts:
        spent = sum(attempt.cost_split.values()) if attempt.cost_split else \
            (exact_flops if is_exact_retrain(attempt.method) else None)
        if total is None or spent is None or math.isnan(spent):
            return None
        total += spent
    return total


def receipt_for(record: BatchRecord, unlearning: BatchUnlearning, aliases: dict[str, ModelRef | None],
                erasure: dict, tier: dict, batch_record: str) -> Receipt:
    """The receipt of a batch whose chosen attempt now serves. ``aliases``: ``original`` and
    ``current`` as the registry has them after the promotion."""
    chosen = unlearning.chosen
    retrained = unlearning.reference or (chosen.version if is_exact_retrain(chosen.method) else None)
    metrics = {"source": unlearning.source_metrics.to_dict(), "unlearned": chosen.metrics,
               **({"retrained": unlearning.reference_metrics.to_dict()} if unlearning.reference_metrics else {})}
    return Receipt(
        batch_id=record.batch_id, scenario=record.scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()), forgotten_per_client=unlearning.forgotten_per_client,
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        method=chosen.method, models={"original": aliases.get("original"), "source": unlearning.source,
                                      "unlearned": chosen.version, "retrained": retrained,
                                      "current": aliases.get("current")},
        certificate=certificate_record(unlearning.certificate), gates=chosen.gates, attempts=unlearning.attempts,
        promoted=True, metrics=metrics, costs=_costs(unlearning), erasure=erasure,
        source_gates=unlearning.source_gates, **tier, batch_record=batch_record)


def receipt_closed_by_retrain(record: BatchRecord, retrain: ModelRef, original: ModelRef | None, erasure: dict,
                              by: str, at: datetime, deadlines: dict[str, datetime], batch_record: str) -> Receipt:
    """The receipt of a batch applied without unlearning (``fedunlearn ingest``) that the exact retrain
    ``retrain`` closes: it serves, and forgets the batch's samples exactly."""
    per_client: dict[str, int] = {}  # two requests of one batch may name samples of the same client
    for entry in record.requests:
        for client, ids in entry.clients.items():
            per_client[client] = per_client.get(client, 0) + len(ids)
    return Receipt(
        batch_id=record.batch_id, scenario=record.scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()), forgotten_per_client=per_client,
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        method=EXACT_RETRAIN_METHOD, models={"original": original, "source": None, "unlearned": retrain,
                                             "retrained": retrain, "current": retrain},
        certificate=certificate_record(retrain_certificate(
            f"applied without unlearning; retrained from scratch on data version {retrain.data_version} ({by})")),
        promoted=True, metrics={}, costs={}, erasure=erasure,
        exactly_forgotten=ExactForgetting(at=at, version=retrain.version, by=by), forgetting="exact",
        deadlines=deadlines, batch_record=batch_record)


def receipt_without_model(record: BatchRecord, source: ModelRef, original: ModelRef | None, erasure: dict,
                          batch_record: str) -> Receipt:
    """The receipt of a batch that deleted every training sample: the deletion stands, nothing serves."""
    return Receipt(
        batch_id=record.batch_id, scenario=record.scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()), forgotten_per_client={},
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        outcome=NO_MODEL, models={"original": original, "source": source, "unlearned": None, "retrained": None,
                                  "current": None},
        promoted=False, metrics={}, costs={}, erasure=erasure, batch_record=batch_record)
