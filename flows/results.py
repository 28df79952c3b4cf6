"""What each flow returns: typed values the commands format, never read by key. A result serialised
for users (the Prefect flow run's result) keeps the keys the flows returned as dicts: fields a
flow left out where they did not apply are left out again (``FlowResult.only_with``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field, RootModel, model_serializer

from fedunlearn.certify.tiers import tier_reading
from fedunlearn.receipts import EscalationStep, ModelRef, Receipt
from fedunlearn.requests.batch import QuarantineNote
from fedunlearn.requests.erasure import ErasureReport


class FlowResult(BaseModel):
    """A flow's result. ``only_with``: fields its serialised form leaves out while they hold their
    default and the field they belong with is None (what a flow with no batch did not say);
    ``flattened``: a field whose own fields stand among the result's."""

    only_with: ClassVar[dict[str, tuple[str, ...]]] = {}
    flattened: ClassVar[tuple[str, ...]] = ()

    def absent(self) -> set[str]:
        fields = type(self).model_fields
        return {name for key, names in self.only_with.items() if getattr(self, key) is None
                for name in names if getattr(self, name) == fields[name].default}

    @model_serializer(mode="wrap")
    def _as_returned(self, handler) -> dict[str, Any]:
        dumped, absent = handler(self), self.absent()
        for name in self.flattened:
            dumped.update(dumped.pop(name) or {})
        return {key: value for key, value in dumped.items() if key not in absent}


class TrainResult(FlowResult):
    """``train-federated``: the version registered and how it was trained."""

    scenario: str
    data_version: str
    test_acc: float
    model_version: str
    run_id: str
    device: str
    wall_seconds: float
    backdoor_samples: int
    runtime: str = "in-process"


class ReferenceResult(FlowResult):
    """``retrain-reference``: the data version's reference, reused or ``trained`` (its training's
    result), and the batches applied without unlearning that it closed."""

    only_with: ClassVar = {"trained": ("trained",), "closed": ("closed",)}
    flattened: ClassVar = ("trained",)

    scenario: str
    data_version: str
    model_version: str
    reused: bool
    trained: TrainResult | None = None
    closed: list[str] | None = None

    @classmethod
    def of_training(cls, result: TrainResult) -> ReferenceResult:
        return cls(scenario=result.scenario, data_version=result.data_version, model_version=result.model_version,
                   reused=False, trained=result)


class BenchmarkResult(RootModel[list[dict[str, Any]]]):
    """``benchmark``: its rows, as results.json holds them (one per method, original and retrain first)."""

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.root


class AuditReferencesResult(FlowResult):
    """``train-audit-references``: the registered set of audit references."""

    scenario: str
    version: str
    references: int
    seconds: float


class RepayResult(FlowResult):
    """``repay-retrain-debt``: the batches repaid, and the exact retrain that serves (none: no debt)."""

    only_with: ClassVar = {"version": ("version", "retired", "shards_retrained", "shards_waiting")}

    scenario: str
    repaid: list[str]
    version: str | None = None
    retired: list[str] = []  # the versions retired once the repayment forgot their requests exactly
    # A federation in shards repaid in part (only the shards due): those retrained, and those still owing.
    shards_retrained: list[int] = []
    shards_waiting: list[int] = []
    # The receipts it wrote (repaid, or closed), for the caller that ran it; the serialised result names the batches.
    receipts: list[Receipt] = Field(default=[], exclude=True, repr=False)
    # The device the exact retrain trained on (None: a reference reused), where its measurement runs.
    device: str | None = Field(default=None, exclude=True, repr=False)


class IngestResult(FlowResult):
    """What intake and the ingest steps did: batches of other scenarios finished, the inbox sorted,
    and the batch applied (its fields absent when there was none)."""

    only_with: ClassVar = {"batch_id": ("batch_id", "applied", "deleted_ids", "per_client", "data_version_before",
                                        "data_version_after", "erasure", "record")}

    scenario: str
    resumed: list[str]
    quarantined: list[QuarantineNote]
    already_applied: list[str]
    left_pending: list[str]
    waiting: dict[str, str]
    status: str
    batch_id: str | None = None
    applied: list[str] = []
    deleted_ids: int = 0
    per_client: dict[int, int] = {}
    data_version_before: str | None = None
    data_version_after: str | None = None
    erasure: ErasureReport | None = None
    record: str | None = None


class AttemptLine(BaseModel):
    """One attempt of the escalation as the command prints it: what its gates said, and whether it
    serves on the interim tier."""

    attempt: int
    method: str
    note: str | None = None
    # None where no gate judged the attempt (an exact retrain needs none)
    verdict: str | None = None
    interim: bool | None = None

    def reading(self, interim_tier: bool) -> str:
        """What the gates said, on the tier that decided: where the interim tier judged, whether it
        serves there beside the strict verdict, so the attempt's line and the batch's agree."""
        if self.verdict is None:
            return self.note or "not gated"
        return tier_reading(self.verdict, self.interim, interim_tier)

    @classmethod
    def of(cls, record: EscalationStep) -> AttemptLine:
        gates = record.gates
        return cls(attempt=record.attempt, method=record.method, note=record.note,
                   verdict=gates.verdict if gates else None, interim=gates.interim if gates else None)


class Timings(BaseModel):
    """Where a flow's time went: compute (data, unlearning, evaluation) against orchestration."""

    flow_seconds: float
    core_seconds: float
    orchestration_seconds: float
    orchestration_share: float
    orchestration_by_stage: dict[str, float] = {}


class ProcessResult(IngestResult):
    """``process-deletions``: the ingest's result, and for a batch its attempts, the version promoted,
    the receipt, the forgetting tier and the retrain debt left. ``exact_run``: what was done about the
    debt (with no batch: present only when a late debt was repaid)."""

    only_with: ClassVar = {**IngestResult.only_with,
                           "receipt": ("method", "certificate", "promoted", "attempts", "models", "receipt",
                                       "forgetting", "exact_due", "retrain_debt", "exact_run", "timings",
                                       "warnings", "siblings_owed"),
                           "forgotten_by": ("forgotten_by",)}

    method: str | None = None
    certificate: str | None = None
    promoted: bool | None = None
    attempts: list[AttemptLine] = []
    models: dict[str, ModelRef | None] = {}
    receipt: str | None = None  # where it is written, relative to the workspace
    # The receipt itself, for the command that ran the flow; the serialised result names its file only.
    receipt_written: Receipt | None = Field(default=None, exclude=True, repr=False)
    forgetting: str | None = None
    exact_due: str | None = None
    retrain_debt: str | None = None
    exact_run: str | None = None
    timings: Timings | None = None
    warnings: list[str] = []  # what the batch warned of, e.g. fallbacks its runner lacks
    # Other scenarios of the dataset whose models still serve the samples the batch deleted, each with
    # the command that forgets them there (``tasks.siblings``).
    siblings_owed: list[str] = []
    # With no batch to run, after waiting for the batch lock: the batch the run waited for formed.
    forgotten_by: str | None = None

    @property
    def reference(self) -> ModelRef | None:
        """The exactly retrained version the batch's attempts were gated against, if any."""
        return self.models.get("retrained")
