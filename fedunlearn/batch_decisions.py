"""The decisions of a deletion batch, apart from the flow that carries them out: which batch is owed
and which model it unlearns from (``owed``), which route it takes (unlearn and escalate, keep the
source, retrain for new features, close without a model), and what its escalation hands on
(``BatchUnlearning``). Elsewhere by subject: the attempts and their order
(``unlearning.escalation``), whether an attempt serves and ends the escalation (``certify.tiers``),
the retrain debt (``retrain_debt``, beside ``shard_debt``) and the receipts (``batch_receipts``).
Plain functions of plain values: the flows and tasks call them, ``tests/test_batch_decisions.py``
checks every branch without Prefect or a workspace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Mapping

from fedunlearn.certify.certificate import EXACT_RETRAIN, Certificate
from fedunlearn.certify.gate_records import GateOutcome
from fedunlearn.evaluation.records import Evaluation, VersionMetrics
from fedunlearn.federation.cost import Cost
from fedunlearn.receipts import EscalationStep, ModelRef
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.unlearning.escalation import EXACT_RETRAIN_METHOD

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


