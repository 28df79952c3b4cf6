"""Flow ``process-deletions``: pending deletion requests in; a new data version and an
unlearned, certified, evaluated and registered model version out, promoted to ``current`` only
when it passes its gates; a receipt for the batch.

    lock ─▶ inbox ─▶ validate (GX + domain rules) ─▶ quarantine invalid ─▶ nothing valid: no-op
         ─▶ data version before the batch + the model trained on it (forget samples in memory)
         ─▶ ledger ─▶ DVC stages + commit (new data version) ─▶ erasure check (the ingest steps)
         ─▶ unlearn [gpu] ─▶ certificate ─▶ evaluate (accuracies, attacks) ─▶ register version
         ─▶ [retrain-reference on the new data version] ─▶ gates ─▶ alias current ─▶ receipt

Exactly once: the ingest steps journal the batch; a run that fails after the ledger append is
resumed by the next run (the data before the batch is read back from the DVC cache), and the
registry holds at most one unlearned version per batch.

Gates (``PromotionGates``, a form in the Prefect UI): against the retrained reference of the new
data version when there is one, otherwise against the source model and chance; see
``tasks.pipeline.PromotionGates``.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import torch
from prefect import flow, get_run_logger

from fedunlearn.benchmark.runner import BenchmarkSetup, make_row
from fedunlearn.certify.certificate import Certificate
from fedunlearn.config import load_params
from fedunlearn.device import intra_op_threads, resolve_device
from fedunlearn.errors import (BatchCannotSucceed, BatchFailed, FedunlearnError, InputError, NoSpace, StateDamaged,
                               is_no_space)
from fedunlearn.evaluation.cost import CostRecord
from fedunlearn.faults import failpoint
from fedunlearn.receipts import NO_MODEL, GateOutcome, ModelRef, Receipt
from fedunlearn.requests.batch import BatchPlan, BatchRecord, QuarantineNote, Triage, record_path
from fedunlearn.requests.erasure import ErasureReport, Fingerprints
from fedunlearn.requests.folders import RequestFolders, batch_lock
from fedunlearn.requests.model import DeletionRequestModel
from fedunlearn.unlearning import available_methods
from flows.ingest import finish_batch, summarize
from flows.reference import retrain_reference as retrain_reference_flow
from tasks import preload
from tasks import workspace as data_versions
from tasks.benchmark import build_evaluator, build_method, evaluate, unlearn
from tasks.pipeline import (LoadedModel, PromotionGates, alias_ref, apply_gates, find_reference, load_data_version,
                            load_source_model, log_reference_metrics, move_alias, prepare_batch, register_version,
                            registered_for_batch, registered_outcome, remove_alias, unlearning_backlog,
                            version_metrics, write_receipt)
from tasks.requests import (capture_fingerprints, collect_inbox, file_applied_requests, open_batch, quarantine_requests,
                            recover_interrupted_batches, scan_stores, submit_requests, validate_requests)
from tasks.timing import FlowClock

MethodChoice = Enum("MethodChoice", {"auto": "auto", **{name: name for name in available_methods()}}, type=str)
DEFAULT_METHODS = {"hfl": "puf-special", "vfl": "fedora", "dfl": "certified-dfu"}
COST_KEYS = ("wall_seconds", "flops", "comm_bytes")
# A batch triggered while another runs waits for it (unlearning, evaluation and an optional retrain
# take minutes) instead of failing; past this it exits with BatchInProgress and its requests wait.
BATCH_LOCK_TIMEOUT_S = 1800.0


def choose_method(method: MethodChoice | str, setting: str) -> str:
    """``auto`` is the setting's default: PUF-Special (HFL), FedORA (VFL), certified DFU (DFL)."""
    name = MethodChoice(method).value
    return DEFAULT_METHODS[setting] if name == "auto" else name


@contextmanager
def stage(record: BatchRecord, step: str) -> Iterator[None]:
    """A failure once the batch is journaled names the batch and the step. One that a re-run can get
    past says to re-run (``BatchFailed``); one that it cannot (damaged state, a batch that can never
    succeed) keeps its meaning and its remedy; a full disk says so."""
    rerun = f"`fedunlearn process --scenario {record.scenario}`"
    where = f"batch {record.batch_id} ({record.scenario}) failed at {step}"
    try:
        yield
    except BatchFailed:
        raise
    except FedunlearnError as err:
        meaning = next(c for c in (StateDamaged, BatchCannotSucceed, NoSpace, InputError, FedunlearnError)
                       if isinstance(err, c))
        raise meaning(f"{where}: {err}") from err
    except Exception as err:
        if is_no_space(err):
            path = getattr(err, "filename", None) or record.scenario
            raise NoSpace(f"{where}: no space left on device ({path}); free space on that filesystem and run {rerun} "
                          "again: the batch resumes where it stopped") from err
        raise BatchFailed(f"{where}: {err}; re-run {rerun} to resume — the ledger is exactly-once and the batch "
                          "continues from the data version before it") from err


@dataclass
class Intake:
    """The inbox sorted and validated (the ingest steps); ``plan.entries`` is the new batch."""

    inbox: Triage = field(default_factory=Triage)
    already_applied: list[str] = field(default_factory=list)
    quarantined: list[QuarantineNote] = field(default_factory=list)
    plan: BatchPlan | None = None


def take_requests(workspace: Path, scenario: str) -> Intake:
    inbox = collect_inbox(workspace, scenario)
    already_applied = file_applied_requests(workspace, inbox.applied)
    plan = validate_requests(workspace, scenario, inbox.pending)
    return Intake(inbox, already_applied, quarantine_requests(workspace, inbox.rejected + plan.rejected), plan)


def on_device(state: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device) for key, value in state.items()}


@flow(name="process-deletions", log_prints=True)
def process_deletions(scenario: str = "mnist5k-hfl", root: str = ".", method: MethodChoice = MethodChoice.auto,
                      requests: list[DeletionRequestModel] | None = None, retrain_reference: bool = False,
                      gates: PromotionGates | None = None, method_options: dict[str, Any] | None = None,
                      device: str | None = None) -> dict:
    """Forget every pending deletion request of ``scenario`` as one batch. ``requests`` (a form in
    the Prefect UI) are written to the inbox first. ``method`` ``auto`` picks the setting's default;
    ``retrain_reference`` also retrains the gold standard on the new data version, which the gates
    then compare with. With nothing pending the run changes nothing."""
    clock = FlowClock()
    workspace = Path(root).resolve()
    params = load_params(workspace / "params.yaml")
    setting = params.scenario(scenario).setting
    name, gates, options = choose_method(method, setting), gates or PromotionGates(), method_options or {}
    folders = RequestFolders.create(workspace)
    if requests:
        submit_requests(workspace, scenario, requests)
    with batch_lock(folders, BATCH_LOCK_TIMEOUT_S, f"fedunlearn process --scenario {scenario}"), \
            intra_op_threads(params.scenario(scenario).threads):
        resumed = [finish_batch(workspace, record)[0] for record in recover_interrupted_batches(workspace)]
        record = unlearning_backlog(workspace, scenario)
        intake = Intake() if record else take_requests(workspace, scenario)
        if record is None and not intake.plan.entries:
            return summarize(folders, scenario, None, resumed, intake.inbox, intake.quarantined,
                             intake.already_applied)
        if record is not None:
            get_run_logger().warning("resuming batch %s: the ledger applied it but no model followed; requests in "
                                     "the inbox wait for the next run", record.batch_id)

        # The samples to forget exist only in the data before the batch: read them before the ledger moves on.
        before = record.data_version_before if record else data_versions.data_version(workspace, scenario)
        batch_id, entries = (record.batch_id, record.requests) if record else (intake.plan.batch_id,
                                                                                 intake.plan.entries)
        dev = resolve_device(device or params.device)
        preload.wait()  # torch.export's tracing state is process-global: no tensor work beside a probe export
        fed_state = load_data_version(workspace, scenario, params, dev, before)
        registered = registered_for_batch(workspace, scenario, "unlearned", batch_id)  # killed after registering
        source = load_source_model(workspace, scenario, before, registered)
        setup = prepare_batch(scenario, fed_state, batch_id, entries)
        build_method(name, setting, setup.batch.kind, None, options)  # an unsupported method stops here
        record = record or open_batch(workspace, intake.plan, intake.quarantined, False)

        with stage(record, "ingest (ledger, new data version, erasure check)"):
            record, fingerprints = finish_batch(workspace, record)
        if setup.batch.num_forget >= sum(len(c) for c in fed_state.clients):
            close_without_model(workspace, record, source)
        with stage(record, f"unlearn ({name})"):
            evaluator = build_evaluator(setup)
            source_metrics, _ = evaluate(evaluator, f"source-v{source.ref.version}",
                                         fed_state.model_from(on_device(source.state, dev)), None)
            if registered is None:
                # PUF recovers until the source model's test accuracy: no reference exists yet.
                outcome, certificate = unlearn(setup, on_device(source.state, dev), name,
                                               source_metrics["test_acc"], options)
            else:
                outcome, certificate = registered_outcome(workspace, scenario, registered)
                name = certificate.method
            model = fed_state.model_from(on_device(outcome.state, dev))
            metrics, _ = evaluate(evaluator, name, model, None)
        with stage(record, "register"):
            unlearned = register_version(
                workspace, scenario, model, tuple(setup.sets.test.x.shape[1:]),
                {"role": "unlearned", "scenario": scenario, "method": name, "batch_id": batch_id,
                 "data_version": record.data_version_after, "certificate": certificate.guarantee,
                 "source_version": source.ref.version},
                {"method": name, "batch_id": batch_id, "requests": len(entries),
                 "forget_samples": setup.batch.num_forget, "data_version_before": before,
                 "source_version": source.ref.version, **options},
                version_metrics({**metrics, **asdict(outcome.cost)}), {"certificate.json": certificate.to_json()})
        failpoint("after-registration")
        with stage(record, "retrained reference"):
            if retrain_reference:
                retrain_reference_flow(scenario=scenario, root=str(workspace), device=device, batch_id=batch_id)
            reference = find_reference(workspace, scenario, record.data_version_after)
            reference_row = None
            if reference is not None:
                reference_metrics, _ = evaluate(evaluator, "retrained",
                                                fed_state.model_from(on_device(reference.state, dev)), None)
                reference_row = {**reference.metrics, **reference_metrics}  # the cost is its training run's
                log_reference_metrics(workspace, reference.ref.run_id, reference_row)
        row = make_row(setup, name, metrics, outcome.cost, certificate,
                       CostRecord(reference_row["wall_seconds"]) if reference_row else None, reference_row,
                       outcome.notes)
        with stage(record, "gates, alias and receipt"):
            gate = apply_gates(row, reference_row, source_metrics, gates)
            if gate.passed:
                move_alias(workspace, scenario, "current", unlearned.version)
            failpoint("after-alias-move")
            # Every store once more, now that the batch registered its versions and logged its runs.
            erasure = scan_erasure(workspace, record, fingerprints)
            receipt = batch_receipt(workspace, record, setup, name, certificate, gate,
                                    {"source": source, "unlearned": unlearned, "retrained": reference},
                                    {"source": source_metrics, "unlearned": row, "retrained": reference_row}, erasure)
            path = write_receipt(workspace, receipt)
            failpoint("after-receipt")
    print(receipt.markdown())
    return {**summarize(folders, scenario, record, resumed, intake.inbox, intake.quarantined, intake.already_applied),
            "method": name, "certificate": certificate.guarantee, "promoted": receipt.promoted,
            "models": {key: ref.model_dump() if ref else None for key, ref in receipt.models.items()},
            "receipt": path.relative_to(workspace).as_posix(), "timings": clock.split()}


def scan_erasure(workspace: Path, record: BatchRecord, fingerprints: Fingerprints | None) -> ErasureReport:
    """The erasure scan of every store (``tasks.stores``) with the batch's fingerprints, taken again
    from the data before the batch when this run did not take them (the batch was resumed)."""
    return scan_stores(workspace, record.purged, fingerprints or capture_fingerprints(workspace, record))


def close_without_model(workspace: Path, record: BatchRecord, source: LoadedModel) -> None:
    """The batch deleted every training sample: no model can be trained or unlearned on what is left.
    The deletion stands (ledger, data version); alias ``current`` — a model trained on the deleted
    samples — is removed; a receipt says so, so no later run retries the batch."""
    scenario = record.scenario
    remove_alias(workspace, scenario, "current")
    erasure = scan_erasure(workspace, record, None)
    receipt = Receipt(
        batch_id=record.batch_id, scenario=scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()), forgotten_per_client={},
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        outcome=NO_MODEL, models={"original": alias_ref(workspace, scenario, "original"), "source": source.ref,
                                  "unlearned": None, "retrained": None, "current": None},
        promoted=False, metrics={}, costs={}, erasure=erasure.model_dump(mode="json"),
        batch_record=record_path(RequestFolders(workspace), record.batch_id).relative_to(workspace).as_posix())
    path = write_receipt(workspace, receipt)
    raise BatchCannotSucceed(
        f"batch {record.batch_id} deleted every training sample of {scenario}: the deletion is applied (data version "
        f"{record.data_version_after}, receipt {path.relative_to(workspace)}) but no model can be trained or unlearned "
        f"on no data, so alias 'current' was removed and nothing serves. Add training data, then train a new model "
        f"with `fedunlearn train --scenario {scenario}`")


def batch_receipt(workspace: Path, record: BatchRecord, setup: BenchmarkSetup, method: str, certificate: Certificate,
                  gate: GateOutcome, models: dict[str, LoadedModel | ModelRef | None],
                  rows: dict[str, dict | None], erasure: ErasureReport) -> Receipt:
    """The receipt: request IDs, data versions, the registry's versions, certificate, gates, metrics, costs."""
    refs = {key: model.ref if isinstance(model, LoadedModel) else model for key, model in models.items()}
    unlearned = rows["unlearned"]
    return Receipt(
        batch_id=record.batch_id, scenario=record.scenario, request_ids=[e.request_id for e in record.requests],
        deleted_samples=len(record.deleted_ids()),
        forgotten_per_client={str(c): len(ids) for c, ids in setup.batch.forget_ids.items()},
        data_version_before=record.data_version_before, data_version_after=record.data_version_after,
        method=method, models={"original": alias_ref(workspace, record.scenario, "original"), **refs,
                               "current": alias_ref(workspace, record.scenario, "current")},
        certificate=json.loads(certificate.to_json()), gates=gate, promoted=gate.passed,
        metrics={key: version_metrics(row) for key, row in rows.items() if row is not None},
        costs={**{key: {k: rows[key][k] for k in COST_KEYS} for key in ("unlearned", "retrained") if rows[key]},
               "speedup_vs_retrain": unlearned["speedup_vs_retrain"]},
        erasure=erasure.model_dump(mode="json"),
        batch_record=record_path(RequestFolders(workspace), record.batch_id).relative_to(workspace).as_posix())
