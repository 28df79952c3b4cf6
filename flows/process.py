"""Flow ``process-deletions``: pending deletion requests in; a new data version and a version of
it that is shown to have forgotten them out, promoted to ``current``; a receipt for the batch.

    intake-requests      lock ─▶ the batch owed by an earlier run, or the inbox validated (GX +
                         domain rules), invalid files quarantined, one batch journaled
    apply-deletions      ledger ─▶ DVC stages + commit (new data version) ─▶ erasure check
    unlearn-and-register the data before the batch (forget samples in memory) + the model trained on
                         it ─▶ [retrain-reference] ─▶ escalation: method ─▶ certificate ─▶ evaluate
                         + per-example audit ─▶ register ─▶ gates; until an attempt passes (the last
                         is exact retrain)
    promote-and-receipt  alias current ─▶ erasure scan of every store ─▶ receipt
    finish-batch         repaid receipts marked ─▶ log leaves + signed head published ─▶ the retrain
                         debt repaid, scheduled or left (``retrain_debt.debt_action``) ─▶ status
                         ─▶ the batch recorded finished

The flow opens the workspace and names the scenario once (``ScenarioScope``); the batch is one value
(``flows.batch.Batch``) built beside it — its record, the device chosen once for the command, the
forgetting policy, the attempts, and what the stores hold of it (attempts registered, source model),
read once here — and each stage takes the whole of one value and returns the next (applied,
``Unlearned``, ``Receipted``, ``Settled``), from which the result is made: no stage opens the
workspace or reads the journal again. Each stage is a task run with its steps' task runs nested
under it — a batch's exact retrain and audit set too: no flow starts another (a flow run's creation
and state changes are blocking calls to the Prefect server, a task run's are events). The stages
live in ``flows.intake``, ``flows.unlearn``, ``flows.promote`` and ``flows.finish``; the batch's
decisions in ``fedunlearn.batch_decisions``.

Every setting runs through it: HFL (PUF-Special by default), VFL (FedORA; a client request is
quarantined — VFL parties hold features of every sample, not samples), DFL (certified DFU, its
residual budget carried from version to version in the registry). One resume point
(``tasks.progress``): a run killed anywhere is finished by the next from what the stores record —
after the receipt too: a batch is finished only once ``finish-batch`` is done (``flows.finish``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterator

from prefect import flow, get_run_logger
from pydantic import Field

from fedunlearn.batch_decisions import recorded_source
from fedunlearn.certify.gates import PromotionGates
from fedunlearn.config import ForgettingPolicy, Runtime
from fedunlearn.device import intra_op_threads
from fedunlearn.errors import (BatchCannotSucceed, BatchFailed, FedunlearnError, InputError, NoSpace, StateDamaged,
                               is_no_space, no_space_path)
from fedunlearn.receipts import receipt_path
from fedunlearn.requests.batch import BatchRecord, BatchRecordDamaged, BatchStatus
from fedunlearn.requests.folders import LockHeld
from fedunlearn.requests.model import DeletionRequestModel
from fedunlearn.runtime_choice import check_flower_training, choose_runtime, flower_attempts, in_process_fallbacks
from fedunlearn.timing import FlowClock
from fedunlearn.unlearning import available_methods
from fedunlearn.unlearning.escalation import Attempt, default_method, planned_attempts
from flows.batch import Batch, Receipted, Settled
from flows.debt import repay
from flows.finish import finish_batch, resume_end
from flows.ingest import summarize
from flows.intake import Intake, apply_deletions, intake_requests
from flows.promote import promote_and_receipt
from flows.results import AttemptLine, ProcessResult, Timings
from flows.unlearn import unlearn_and_register
from runtime.events import announce_processed
from stores.workspace import ScenarioScope, Workspace
from tasks.data import command_device, reproduce_data
from tasks.debt import late_repayment
from tasks.models import backdoor_ids, load_source_model
from tasks.progress import attempts_registered
from tasks.receipts import publish_receipt
from tasks.requests import submit_requests
from tasks.status_health import refuse_wrong_serving
from tasks.transparency import verify_before_writing
from tasks.unlearning import flower_methods, gpu_slot

MethodChoice = Enum("MethodChoice", {"auto": "auto", **{name: name for name in available_methods()}}, type=str)
# A batch triggered while another runs waits for it (unlearning, evaluation and an optional retrain
# take minutes) instead of failing; past this it exits with BatchInProgress and its requests wait.
BATCH_LOCK_TIMEOUT_S = 1800.0
RUNNER_FIELD = ("the engine of the unlearning attempts: in-process (our loop), flower (a local Flower deployment) or "
                "flower-simulation (Flower's simulation engine); HFL only, the exact retrain stays in-process. Empty: "
                "the scenario's runner in params.yaml, else in-process")


def choose_method(method: MethodChoice | str, setting: str, kind: str | None = None) -> str:
    """``auto`` is the default for the setting and request kind: PUF-Special (HFL), FedORA (VFL; ``ga``
    for VFL sample requests), certified DFU (DFL)."""
    name = MethodChoice(method).value
    return default_method(setting, kind) if name == "auto" else name


@contextmanager
def stage(record: BatchRecord, step: str, receipted: bool = False) -> Iterator[None]:
    """A failure once the batch is journaled names the batch and the step. One that a re-run can get
    past says to re-run (``BatchFailed``); one that it cannot (damaged state, a batch that can never
    succeed) keeps its meaning and its remedy; a full disk says so. ``receipted``: the batch's receipt
    is written, only its end steps are left."""
    rerun = f"`fedunlearn process --scenario {record.scenario}`"
    where = f"{record.batch_id} ({record.scenario}) failed at {step}"
    try:
        yield
    except BatchFailed:
        raise
    except FedunlearnError as err:
        meaning = next(c for c in (StateDamaged, BatchCannotSucceed, NoSpace, InputError, FedunlearnError)
                       if isinstance(err, c))
        # A store's own full-disk error says "the same command": this one names it
        again = f"; once space is freed, run {rerun} again" if meaning is NoSpace and rerun not in str(err) else ""
        raise meaning(f"{where}: {err}{again}{batch_state(record, receipted)}") from err
    except Exception as err:
        if is_no_space(err):
            path = no_space_path(err) or record.scenario
            raise NoSpace(f"{where}: no space left on device ({path}); free space on that filesystem and run {rerun} "
                          "again: the batch resumes where it stopped") from err
        raise BatchFailed(f"{where}: {err}; re-run {rerun} to resume — " + (
            "the batch's receipt is written, and the re-run completes its end steps" if receipted else
            "the ledger is exactly-once and the batch continues from the data version before it")) from err


def batch_state(record: BatchRecord, receipted: bool = False) -> str:
    """What a failure after the ingest steps leaves behind, said plainly: the deletion is applied to
    the data (an error's "nothing was changed" would be untrue), the model step is not done — or,
    once the receipt is written, only the end steps are left."""
    if record.status is not BatchStatus.COMPLETE:
        return ""
    if receipted:
        return (f". State of {record.batch_id}: its receipt is written and `current` serves its version; its end steps "
                "(the log's signed head, receipts it repays, the retrain debt, the status) are not all done, so "
                f"`fedunlearn process --scenario {record.scenario}` completes them first")
    return (f". State of {record.batch_id}: its {len(record.requests)} request(s) ARE applied to the data "
            f"(ledger entries written, data version {record.data_version_before} -> {record.data_version_after}, "
            "request files in processed/); the model step did not finish and no receipt is written, so the batch "
            f"stays owed: once the cause is fixed, `fedunlearn process --scenario {record.scenario}` resumes it "
            "from the model step")


@flow(name="process-deletions", log_prints=True)
def process_deletions(scenario: str = "mnist5k-hfl", root: str = ".", method: MethodChoice = MethodChoice.auto,
                      requests: list[DeletionRequestModel] | None = None, retrain_reference: bool = False,
                      gates: PromotionGates | None = None, method_options: dict[str, Any] | None = None,
                      escalation: list[Attempt] | None = None, device: str | None = None,
                      forgetting_policy: ForgettingPolicy | None = None,
                      runner: Runtime | None = Field(None, description=RUNNER_FIELD)) -> ProcessResult:
    """Forget every pending deletion request of ``scenario`` as one batch; with none, nothing changes.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        root: the workspace (the directory holding params.yaml).
        method: the first attempt's method; auto: the setting's default for the request kind.
        requests: requests to put into the inbox first (this run forgets them).
        retrain_reference: retrain exactly on the new data version first, as the gates' reference.
        gates: the promotion gates' limits; empty: the defaults.
        method_options: the first attempt's hyperparameters, e.g. {"eta_u": 4.0}.
        escalation: the attempts in order; empty: the method, stronger, another method, exact retrain.
        device: auto, cpu, cuda or mps; empty: params.yaml's device.
        forgetting_policy: interim (serve the first attempt that fails no check, exact retrain due by the
            deadlines) or strict (escalate until one passes every check); empty: params.yaml's.
    """
    clock, ws = FlowClock(), Workspace.open(root)
    scope = ScenarioScope(ws, scenario)
    choice = Choice(MethodChoice(method), method_options or {}, escalation, gates or PromotionGates(),
                    retrain_reference, ForgettingPolicy(forgetting_policy or ws.params.forgetting_policy),
                    choose_runtime(runner, scope.config.runner))
    check_runner(choice, scope)  # an unknown name, or one the engine lacks, fails before anything is taken
    if requests:
        submit_requests(scope, requests)
    with ws.batch_lock(BATCH_LOCK_TIMEOUT_S, f"fedunlearn process --scenario {scenario}") as held, \
            intra_op_threads(scope.config.threads):
        verify_first(ws, scenario)
        taken = intake_requests(scope, take_owed=True)
        clock.stage("intake-requests")
        announce_processed([n.request_id or n.file for n in taken.quarantined], scope.scenario, "quarantined",
                           taken.batch.batch_id if taken.batch else "none")
        ended = finish_earlier(scope, taken, device)
        if taken.batch is None:
            return nothing_to_process(scope, taken, device, ended).model_copy(
                update={"forgotten_by": waited_for_batch(held, scenario)})
        held.note_batch(taken.batch.batch_id, scenario)
        batch = start_batch(scope, taken, choice, device)
        with stage(batch.record, "ingest (ledger, new data version, erasure check)"):
            batch = batch.applied(apply_deletions(ws, batch.record))
        clock.stage("apply-deletions")
        with stage(batch.record, "unlearn and register"), gpu_slot(batch.device):
            unlearned = unlearn_and_register(scope, batch)
        clock.stage("unlearn-and-register")
        with stage(batch.record, "alias and receipt"):
            receipted = promote_and_receipt(scope, unlearned)
            publish_receipt(receipted.receipt)
        clock.stage("promote-and-receipt")
        with stage(batch.record, "end steps (log, debt, status)", receipted=True):
            settled = finish_batch(scope, receipted)
        clock.stage("debt-and-status")
    print(receipted.receipt.markdown())
    timings = Timings(**clock.split())
    print_timings(timings)  # in the flow run's log too: a served run (no CLI to print it) shows where its time went
    return processed(scope, taken, settled, timings)


def verify_first(ws: Workspace, scenario: str) -> None:
    """Verify, then write: damage (the intake checks the ledger itself) or ``current`` moved by hand to
    a version that must not serve stops the batch before a request is taken. The source is read from
    current first: such a version would be unlearned from, or fail the batch after taking its requests."""
    command = f"`fedunlearn process --scenario {scenario}`"
    verify_before_writing(ws.root, command, ledger_checked=True)
    try:
        refuse_wrong_serving(ws, scenario, command, "a batch would unlearn from it or find it gone after taking its "
                             "requests")
    except BatchRecordDamaged:
        pass  # the intake stops on it before taking anything, naming the batch and its requests


@dataclass(frozen=True)
class Choice:
    """What the caller chose for the batch: the method (``auto``: the setting's default) and its
    options, the escalation's attempts if named, the gates, whether to retrain the reference first,
    the forgetting policy, and the engine of the unlearning."""

    method: MethodChoice
    method_options: dict[str, Any]
    escalation: list[Attempt] | None
    gates: PromotionGates
    retrain_reference: bool
    forgetting: ForgettingPolicy
    runtime: Runtime = Runtime.in_process

    @property
    def by_user(self) -> bool:
        """The user named the attempts, so the source's audit does not reorder them."""
        return bool(self.escalation or self.method_options) or self.method.value != "auto"


def check_runner(choice: Choice, scope: ScenarioScope) -> None:
    """The chosen method exists, and the chosen engine can run it on this scenario: checked before a
    request is taken, so a wrong ``--runner`` leaves the inbox as it was."""
    setting = scope.config.setting
    first = Attempt(method=choose_method(choice.method, setting), options=choice.method_options)
    check_flower_training(choice.runtime, scope.scenario, setting)
    if not first.exact:
        flower_attempts(choice.runtime, [first], flower_methods(), True)


def start_batch(scope: ScenarioScope, taken: Intake, choice: Choice, device: str | None) -> Batch:
    """The batch value every stage is handed: the device chosen once for the command, the attempts in
    order (an unsupported method stops here, before the ledger moves on), and what the stores hold of
    it, read once, here: the attempts an earlier run registered and the source model (the one they
    recorded, else the version on the data before the batch)."""
    record = taken.batch
    if taken.owed:
        get_run_logger().warning("resuming %s, which an earlier run left unfinished; requests in the "
                                 "inbox wait for the next run", record.batch_id)
    ws, setting = scope.ws, scope.config.setting
    first = Attempt(method=choose_method(choice.method, setting, record.kind), options=choice.method_options)
    attempts = planned_attempts(setting, record.kind, first, choice.escalation)
    # Strict only for attempts the user named (an escalation): a chosen --method is the first attempt,
    # checked as such, and the default chain's fallbacks after it may run in-process where Flower lacks them.
    kept = flower_attempts(choice.runtime, attempts, flower_methods(), bool(choice.escalation))
    in_process = in_process_fallbacks(choice.runtime, kept, flower_methods())
    if in_process:
        get_run_logger().warning("%s", in_process)
    with stage(record, "reading the source model"):
        registered = attempts_registered(ws, record.scenario, record.batch_id)
        source = load_source_model(ws, record.scenario, record.data_version_before, recorded_source(registered))
    return Batch(record, command_device(ws, device), choice.forgetting, tuple(kept), choice.by_user,
                 choice.gates, choice.retrain_reference, registered, source, tuple(backdoor_ids(ws, record.scenario)),
                 runtime=choice.runtime, warnings=(in_process,) if in_process else ())


def print_timings(timings: Timings) -> None:
    print(f"flow {timings.flow_seconds:.2f} s: compute {timings.core_seconds:.2f} s, orchestration "
          f"{timings.orchestration_seconds:.2f} s ({timings.orchestration_share:.1%})"
          + "; orchestration by stage: " + ", ".join(f"{name} {seconds:.2f} s"
                                                   for name, seconds in timings.orchestration_by_stage.items()))


def processed(scope: ScenarioScope, taken: Intake, settled: Settled, timings: Timings) -> ProcessResult:
    """The flow's result, from the batch settled: what intake did, the batch's attempts, the version
    promoted, the receipt (and where it is written), the forgetting tier and the retrain debt left."""
    receipted = settled.receipted
    receipt = receipted.receipt
    return ProcessResult(
        **dict(summarize(scope, receipted.record, taken)), method=receipt.method, certificate=receipt.guarantee,
        promoted=receipt.promoted, attempts=[AttemptLine.of(a) for a in receipt.attempts], models=dict(receipt.models),
        receipt=scope.ws.relative(receipted.path), receipt_written=receipt, forgetting=receipt.forgetting,
        exact_due=receipt.exact_due.isoformat() if receipt.exact_due else None,
        retrain_debt=settled.debt.line(scope.ws.params.requests.max_retrain_debt), exact_run=settled.exact_run,
        siblings_owed=list(settled.siblings_owed), timings=timings, warnings=list(receipted.warnings))


def finish_earlier(scope: ScenarioScope, taken: Intake, device: str | None) -> Settled | None:
    """The end steps of a batch an earlier run receipted and stopped before finishing, first: they come
    before any new batch, as they would have in a run never killed."""
    unfinished = taken.unfinished
    if unfinished is None:
        return None
    with stage(unfinished.record, "end steps (log, debt, status)", receipted=True):
        return resume_end(scope, Receipted(unfinished.record, unfinished.receipt,
                                           receipt_path(scope.ws.root, unfinished.record.batch_id),
                                           command_device(scope.ws, device)))


def waited_for_batch(held: LockHeld, scenario: str) -> str | None:
    """The batch of ``scenario`` that the run this one waited for formed (its note beside the lock):
    it took the requests that were pending when this run began."""
    previous = held.previous or {}
    if held.waited and previous.get("batch_id") and previous.get("scenario") == scenario:
        return f"{previous['batch_id']} (formed by `{previous.get('command')}`, which held the batch lock)"
    return None


def nothing_to_process(scope: ScenarioScope, taken: Intake, device: str | None,
                       ended: Settled | None = None) -> ProcessResult:
    """No batch to run: what intake did, the end steps of a batch an earlier run left (``ended``: what
    they did about the debt), and the retrain debt repaid if it could not wait."""
    if taken.retrain_open:
        exact_run = close_owed(scope, device)
    else:
        exact_run = (ended.exact_run if ended else None) or repay_if_late(scope, device)
    return ProcessResult(**dict(summarize(scope, None, taken)), exact_run=exact_run,
                         siblings_owed=list(ended.siblings_owed) if ended else [])


def close_owed(scope: ScenarioScope, device: str | None) -> str:
    """Several batches are owed, a sibling scenario's deletions among them, and no registered model is
    on the data before the first: an exact retrain on the current data version forgets them all, and
    closes each with its receipt (``repay``)."""
    get_run_logger().warning("%s owes forgetting for several batches (deletions applied under another scenario of "
                             "its dataset among them) and no model can be unlearned to its current data: retraining "
                             "exactly", scope.scenario)
    repaid = repay(scope, command_device(scope.ws, device), reproduce_data(scope.ws, scope.scenario))
    return f"repaid in this run: it closes {', '.join(repaid.repaid)}"


def repay_if_late(scope: ScenarioScope, device: str | None) -> str | None:
    """With no batch to run: a retrain debt whose latest safe start has passed is repaid now, as after a
    batch. Waiting for a new request (or for a schedule no served deployment runs) could miss the
    deadline. A failed repayment exits non-zero and names `fedunlearn repay-debt`."""
    ws, scenario = scope.ws, scope.scenario
    start_by = late_repayment(ws, scenario)
    if start_by is None:
        return None
    get_run_logger().warning("the retrain debt of %s is past its latest safe start (%s): repaying it now", scenario,
                             f"{start_by:%Y-%m-%d %H:%M}Z")
    try:
        repay(scope, command_device(ws, device), reproduce_data(ws, scenario), only_due=True)
    except Exception as err:
        meaning = next((c for c in (StateDamaged, BatchCannotSucceed, NoSpace, InputError, FedunlearnError)
                        if isinstance(err, c)), BatchFailed)
        raise meaning(f"the retrain debt of {scenario} is past its latest safe start ({start_by:%Y-%m-%d %H:%M}Z) "
                      f"and repaying it failed: {err}. Once the cause is fixed, run `fedunlearn repay-debt --scenario "
                      f"{scenario}` (or `fedunlearn process --scenario {scenario}` again)") from err
    return f"repaid in this run: its latest safe start ({start_by:%Y-%m-%d %H:%M}Z) had passed"
