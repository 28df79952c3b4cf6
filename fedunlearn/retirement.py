"""Which registered versions still hold deleted samples, and when each may — and must — lose its
weights. Pure: facts about versions and batches in, a plan out; no store is touched.

A version *owes* a batch when its weights learnt samples the batch deleted:

    trained from scratch (original, retrained) on data version D   every batch applied from D on
    unlearned on data version D from source S                      the same, and whatever S owes —
                                                                   but the batch that made it, when it
                                                                   forgot that one exactly (formal)
    repaid (shards in part retrained, the rest kept from S) on D   the same as unlearned: a kept shard
                                                                   may still hold what S owes

A version *retires* once every batch it owes is exactly forgotten (an exact retrain, or a formal
certificate, serves without them) — the batch that completes the set names the tombstone — unless a
hold keeps it. Until then it is *pending*, due by the earliest deadline of the requests it holds:
exact forgetting is due then, and the weights that remember them must go with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

EXACT_TIERS = ("exact", "formal")
INHERITING = ("unlearned", "repaid")  # roles whose weights come (in part) from a source version


@dataclass(frozen=True)
class VersionFacts:
    """A registered version as its tags describe it."""

    version: str
    role: str
    data_version: str | None
    source_version: str | None = None
    batch_id: str | None = None  # the batch that made it (unlearned, or a batch's own retrain)
    forgetting: str | None = None  # interim | exact | formal
    held: str | None = None  # the reason of a hold
    retired_by: str | None = None


@dataclass(frozen=True)
class BatchFacts:
    """A batch of the scenario, in journal order: the data versions it moved between, whether its
    requests are exactly forgotten, and their earliest deadline."""

    batch_id: str
    data_version_before: str | None
    data_version_after: str | None
    exact: bool
    due: datetime | None = None
    requests: tuple[str, ...] = ()


@dataclass
class RetirementPlan:
    retire: dict[str, str] = field(default_factory=dict)  # version -> the batch whose exact forgetting retires it
    pending: dict[str, datetime | None] = field(default_factory=dict)  # version -> due
    held: dict[str, list[str]] = field(default_factory=dict)  # version -> the requests it still holds
    owed: dict[str, list[str]] = field(default_factory=dict)  # version -> the batches it owes, in journal order


def batches_from(data_version: str | None, batches: list[BatchFacts]) -> list[str]:
    """The batches applied from ``data_version`` on, following the chain of data versions."""
    chain, current, seen = [], data_version, set()
    by_before = {b.data_version_before: b for b in batches if b.data_version_before}
    while current in by_before and current not in seen:
        seen.add(current)
        batch = by_before[current]
        chain.append(batch.batch_id)
        current = batch.data_version_after
    return chain


def owed_batches(versions: list[VersionFacts], batches: list[BatchFacts]) -> dict[str, list[str]]:
    """Each version's owed batches (module docstring), in journal order."""
    by_number = {v.version: v for v in versions}
    order = {b.batch_id: i for i, b in enumerate(batches)}
    owed: dict[str, set[str]] = {}

    def of(facts: VersionFacts, depth: int = 0) -> set[str]:
        if facts.version in owed:
            return owed[facts.version]
        found = set(batches_from(facts.data_version, batches))
        source = by_number.get(facts.source_version or "")
        if facts.role in INHERITING and source is not None and depth < len(versions):
            inherited = of(source, depth + 1)
            if facts.forgetting in EXACT_TIERS:
                inherited = inherited - {facts.batch_id}
            found |= inherited
        owed[facts.version] = found
        return found

    return {v.version: sorted(of(v), key=lambda b: order.get(b, len(order))) for v in versions}


def plan_retirement(versions: list[VersionFacts], batches: list[BatchFacts], serving: str | None) -> RetirementPlan:
    """What retires now, what waits (and until when), what a hold keeps. The version ``serving``
    (alias current) never retires: a batch that still needs it is not done."""
    by_id = {b.batch_id: b for b in batches}
    plan = RetirementPlan(owed={k: v for k, v in owed_batches(versions, batches).items() if v})
    for facts in versions:
        owed = plan.owed.get(facts.version)
        if not owed or facts.retired_by:
            continue
        if facts.held:
            plan.held[facts.version] = [r for b in owed for r in by_id[b].requests]
        elif all(by_id[b].exact for b in owed) and facts.version != serving:
            plan.retire[facts.version] = owed[-1]
        else:
            dues = [by_id[b].due for b in owed if by_id[b].due is not None]
            plan.pending[facts.version] = min(dues) if dues else None
    return plan
