"""One receipt builder per batch outcome — served (``receipt_for``), closed by an exact retrain
(``receipt_closed_by_retrain``), no model left (``receipt_without_model``) — with the parts they
share: the certificate as a receipt records it, the tier fields, the costs and the batch's FLOPs.
The receipt itself, its fields and its reading are ``fedunlearn.receipts``'.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime
from typing import Any, Callable

from fedunlearn.batch_decisions import UNCHANGED, BatchUnlearning, retrain_certificate
from fedunlearn.certify.certificate import Certificate
from fedunlearn.certify.tiers import Tier, exact_due, tier_of
from fedunlearn.config import ForgettingPolicy
from fedunlearn.receipts import NO_MODEL, EscalationStep, ExactForgetting, ModelRef, Receipt
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.unlearning.escalation import EXACT_RETRAIN_METHOD, is_exact_retrain


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


@dataclasses.dataclass(frozen=True)
class TierFields:
    """The receipt's tier fields: the tier the chosen version forgets on (``forgetting``), the policy
    the batch ran under, each request's deadline and, on the interim tier, when exact forgetting is
    due and the latest safe time to start it."""

    forgetting: str
    policy: str
    deadlines: dict[str, datetime]
    exact_due: datetime | None = None
    exact_start_by: datetime | None = None

    @property
    def interim(self) -> bool:
        return self.forgetting == Tier.interim.value


def tier_fields(deadlines: dict[str, datetime], certificate: str | None, forgetting: ForgettingPolicy,
                start_by: Callable[[datetime], datetime]) -> TierFields:
    """``TierFields`` of a version with ``certificate`` (``start_by``: a due time's latest safe start)."""
    tier = tier_of(certificate)
    if tier is not Tier.interim:
        return TierFields(tier.value, forgetting.value, deadlines)
    due = exact_due(deadlines.values())
    return TierFields(tier.value, forgetting.value, deadlines, exact_due=due, exact_start_by=start_by(due))


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
                erasure: dict, tier: TierFields, batch_record: str) -> Receipt:
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
        source_gates=unlearning.source_gates, **dataclasses.asdict(tier), batch_record=batch_record)


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


__all__ = ["certificate_record", "TierFields", "tier_fields", "speedup", "batch_flops", "receipt_for", "receipt_closed_by_retrain",
           "receipt_without_model"]
