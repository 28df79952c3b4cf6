"""The two-tier contract through the CLI, a temporary Prefect server, a real DVC repository and a
real sqlite MLflow registry, with an injected clock (``FEDUNLEARN_NOW``): an interim batch serves
an approximate version at once and Prefect holds a scheduled run of ``repay-retrain-debt`` at the
latest safe time; ``status`` exits 9 for a request left interim past its deadline; the repayment
(as that run would start it) forgets exactly before the deadline; a batch that finds the safe time
passed repays at once; ``strict`` escalates as before. Then a batch applied without unlearning and
closed by ``fedunlearn retrain``.

Each test reads as arrange, act, assert. A scenario of several commands in turn (a batch, then
``status``, then the repayment, ...) is run once for the module by a fixture that returns a frozen
record of what each command printed and left; its tests only assert. A test that acts on such a
scenario's workspace takes a copy."""

import itertools
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.runner import Runner

import flows.unlearn as unlearn_stage
import tasks.data as data_tasks
from fedunlearn.receipts import ExactForgetting, Receipt, read_receipt, read_receipts
from fedunlearn.requests.model import CLOCK_VARIABLE
from flows.debt import repay_retrain_debt
from flows.results import ReferenceResult
from stores.registry import Registry
from stores.workspace import Workspace, data_version
from tasks.forget_sets import measured_on
from workspaces import Printed, call_cli, copy_workspace, status_row

SCENARIO = "digits-hfl"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
# What a digits-hfl batch of client 1's samples tries under `strict`: every approximate attempt is
# held back (no check fails, none is passed either) and the exact retrain serves.
STRICT_ESCALATION = ["puf-special", "puf-special", "puf-regular", "fedquit", "retrain"]


class Clock:
    """The CLI of one workspace at a simulated time (``FEDUNLEARN_NOW``, set for the call alone)."""

    def __init__(self, workspace: Path):
        self.workspace = workspace

    def call(self, *args: str, at: datetime = T0) -> Printed:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(CLOCK_VARIABLE, at.isoformat())
            return call_cli(self.workspace, *args)

    def ok(self, *args: str, at: datetime = T0) -> str:
        """A call that must succeed (it arranges a test's state): what it printed."""
        printed = self.call(*args, at=at)
        assert printed.status == 0, printed.err
        return printed.out


def trained_copy(template: Path, directory: Path) -> Path:
    return copy_workspace(template, directory / "workspace")


@pytest.fixture
def trained(trained_digits_hfl, prefect_server):
    """digits-hfl trained (a copy of the session's), with the session's Prefect server."""
    return trained_digits_hfl


def request(clock: Clock, client: int, deadline: datetime | None = None, at: datetime = T0) -> list[str]:
    ids = clock.ok("ids", "--scenario", SCENARIO, "--client", str(client), "--limit", "12", at=at).split()
    extra = ["--deadline", deadline.isoformat()] if deadline else []
    return [clock.ok("request", "samples", "--scenario", SCENARIO, "--ids", *ids, *extra, at=at).strip()]


def current(workspace):
    return Registry(workspace).by_alias(SCENARIO, "current")


def repayment_deployment(workspace: Path) -> str:
    """What `make serve` registers: the repay-retrain-debt deployment (its runner is not started).
    Its caller deletes it (``delete_deployment``) once done: the session's Prefect server is shared,
    and another test's status must not find it served."""
    return str(Runner().add_flow(repay_retrain_debt, name="weekly",
                                 parameters={"root": str(workspace), "scenario": SCENARIO}))


def delete_deployment(deployment_id: str) -> None:
    with get_client(sync_client=True) as client:
        client.delete_deployment(deployment_id)


def scheduled_repayments(deployment_id: str) -> list:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    return [r for r in runs if r.state and r.state.is_scheduled()]


# --- an interim batch, Prefect's scheduled repayment, status before and past the deadline, the repayment

@dataclass(frozen=True)
class Interim:
    """A batch with a deadline two days on, with the repay-retrain-debt deployment registered: what
    each command printed and what the stores held after it."""

    workspace: Path
    first: str                         # the batch's request
    deadline: datetime
    processed: Printed                 # `process` at T0
    receipt: Receipt                   # the batch's receipt right after it
    serving: object                    # the version `current` named right after it (an MLflow ModelVersion)
    retrained_after_batch: list        # the retrained versions right after it
    scheduled: list                    # the deployment's scheduled flow runs right after it
    status_interim: Printed            # `status` a day on
    status_overdue: Printed            # `status` an hour past the deadline, nothing repaid
    repaid: Printed                    # `repay-debt` at the latest safe start (what the scheduled run starts)
    exactly_forgotten: ExactForgetting  # the receipt's record of the repayment
    serving_after_repayment: object    # the version `current` names after it
    status_repaid: Printed             # `status` an hour past the deadline, repaid
    compared: Printed                  # `compare` after the repayment


@pytest.fixture(scope="module")
def interim(digits_hfl_template, prefect_server, tmp_path_factory) -> Interim:
    # arrange
    workspace = trained_copy(digits_hfl_template, tmp_path_factory.mktemp("interim"))
    clock, deadline = Clock(workspace), T0 + timedelta(days=2)
    deployment_id = repayment_deployment(workspace)
    try:
        [first] = request(clock, client=1, deadline=deadline)

        # act: the batch, status on either side of the deadline, the repayment, status and compare after it
        processed = clock.call("process", "--scenario", SCENARIO)
        [receipt] = read_receipts(workspace, SCENARIO)
        batch = dict(receipt=receipt, serving=current(workspace),
                     retrained_after_batch=Registry(workspace).versions(SCENARIO, role="retrained"),
                     scheduled=scheduled_repayments(deployment_id))
        status_interim = clock.call("status", "--scenario", SCENARIO, at=T0 + timedelta(days=1))
        status_overdue = clock.call("status", "--scenario", SCENARIO, at=deadline + timedelta(hours=1))
        repaid = clock.call("repay-debt", "--scenario", SCENARIO, at=receipt.exact_start_by)
        exactly_forgotten = read_receipt(workspace, receipt.batch_id).exactly_forgotten
        serving_after_repayment = current(workspace)
        status_repaid = clock.call("status", "--scenario", SCENARIO, at=deadline + timedelta(hours=1))
        compared = clock.call("compare", "--scenario", SCENARIO)
    finally:
        delete_deployment(deployment_id)
    return Interim(workspace, first, deadline, processed, status_interim=status_interim,
                   status_overdue=status_overdue, repaid=repaid, exactly_forgotten=exactly_forgotten,
                   serving_after_repayment=serving_after_repayment, status_repaid=status_repaid, compared=compared,
                   **batch)


def test_an_interim_batch_serves_an_approximate_version_at_once(interim):
    # assert
    receipt, serving, out, deadline = interim.receipt, interim.serving, interim.processed.out, interim.deadline
    assert interim.processed.status == 0, interim.processed.err
    assert receipt.forgetting == "interim" and receipt.policy == "interim" and receipt.exact_due == deadline
    assert receipt.deadlines == {interim.first: deadline} and receipt.exact_start_by < deadline
    assert serving.tags["forgetting"] == "interim" and serving.tags["role"] == "unlearned"
    assert serving.tags["data_version"] == receipt.data_version_after != receipt.data_version_before
    assert [a.method for a in receipt.attempts] == ["puf-special"] and receipt.attempts[0].gates.interim
    assert not interim.retrained_after_batch  # no exact retrain in the batch
    assert receipt.source_gates is not None
    assert f"alias current -> v{serving.version} (puf-special, " in out  # the reason on the line that says it serves
    assert next(line for line in out.splitlines() if line.startswith("alias current ->")).count(
        "serves on the interim tier — no check failed") == 1 and "; exact forgetting due by" in out
    assert "serves on the **interim** tier" in receipt.markdown()


def test_the_receipt_says_where_the_batch_s_flops_went(interim):
    """The served attempt's FLOPs split into the method's and judging it; the batch's total adds the
    source's judging, so it exceeds the served attempt's own FLOPs."""
    costs = interim.receipt.costs
    split = costs["unlearned"]["split"]
    assert {"evaluation", "audit"} <= set(split) and min(split.values()) > 0
    assert sum(split.values()) > costs["unlearned"]["flops"]
    assert costs["batch"]["attempts"] == 1 and costs["batch"]["flops"] > sum(split.values())


def test_an_interim_batch_leaves_a_run_of_repay_retrain_debt_scheduled_at_the_latest_safe_start(interim):
    # assert
    [scheduled] = interim.scheduled
    assert scheduled.expected_start_time == interim.receipt.exact_start_by
    assert scheduled.parameters["scenario"] == SCENARIO
    assert scheduled.parameters["only_due"] is True  # a federation in shards: the shards due then (shard_debt)


def test_before_its_deadline_status_shows_the_request_interim(interim):
    # assert
    assert interim.status_interim.status == 0, interim.status_interim.err
    assert status_row(interim.status_interim.out, interim.first)[1] == "interim"


def test_past_its_deadline_status_exits_9_for_a_request_left_interim(interim):
    # assert
    assert interim.status_overdue.status == 9, interim.status_overdue.err


def test_the_repayment_the_scheduled_run_starts_forgets_exactly_before_the_deadline(interim):
    # assert
    assert interim.repaid.status == 0, interim.repaid.err
    assert interim.exactly_forgotten.at == interim.receipt.exact_start_by < interim.deadline
    serving = interim.serving_after_repayment
    assert serving.tags["forgetting"] == "exact" and serving.tags["role"] == "retrained"


def test_once_repaid_status_shows_the_request_forgotten_exactly(interim):
    # assert
    assert interim.status_repaid.status == 0, interim.status_repaid.err
    assert status_row(interim.status_repaid.out, interim.first)[1] == "exact"


def test_once_repaid_compare_shows_the_three_versions_on_the_forget_set(interim):
    # assert
    assert interim.compared.status == 0, interim.compared.err
    compared_on_the_forget_set(interim.workspace, interim.receipt, interim.compared.out)


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of the first table a command printed as plain text: columns under a dashed line."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if "--" in line and set(line) <= {"-", " "})
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[at])]
    keys = [lines[at - 1][a:b].strip() for a, b in spans]
    rows = itertools.takewhile(str.strip, lines[at + 1:])
    return [dict(zip(keys, (row[a:b].strip() for a, b in spans))) for row in rows]


def compared_on_the_forget_set(workspace, receipt, compared: str) -> None:
    """Original (the batch's source), unlearned and retrained (the debt's exact retrain) side by side on
    the batch's forget set, in ``compare`` and as each run's metrics (MLflow's compare view); the
    source's figures are the batch's own measurement; runs named by role and version."""
    samples = sum(receipt.forgotten_per_client.values())
    assert f"on the forget set of {receipt.batch_id} ({samples} samples)" in compared
    rows = table_rows(compared)
    assert [row["role"] for row in rows] == ["original", "unlearned", "retrained"]
    assert all(row[key] != "–" for row in rows for key in ("forget_acc", "mia_auc", "audit_auc")), compared
    registry = Registry(workspace)
    runs = [registry.client.get_run(v.run_id) for v in registry.versions(SCENARIO)]
    assert all(math.isfinite(r.data.metrics[key]) for r in runs for key in ("forget_acc", "mia_auc", "audit_auc"))
    assert runs[0].data.metrics["forget_acc"] == receipt.metrics["source"]["forget_acc"]
    assert [r.data.tags.get("forget_set") for r in runs] == [receipt.batch_id, None, receipt.batch_id]
    assert [r.info.run_name for r in runs] == [f"original v1 · {SCENARIO}",
                                               f"unlearned v2 (puf-special) · {receipt.batch_id}",
                                               f"retrained v3 · {SCENARIO}"]


# --- a batch that finds the latest safe start passed

@dataclass(frozen=True)
class Urgent:
    workspace: Path
    urgent: str                        # the batch's request: due an hour after the batch runs
    later: datetime                    # when the batch runs: three days after T0
    processed: Printed                 # `process` then
    receipt: Receipt                   # the batch's receipt right after it
    serving: object                    # the version `current` named right after it
    status: Printed                    # `status` two hours later
    resolved: list[str]                # the device names `process` resolved (batch and repayment)


@pytest.fixture(scope="module")
def urgent(digits_hfl_template, prefect_server, tmp_path_factory) -> Urgent:
    # arrange
    workspace = trained_copy(digits_hfl_template, tmp_path_factory.mktemp("urgent"))
    clock, later = Clock(workspace), T0 + timedelta(days=3)
    [urgent] = request(clock, client=2, deadline=later + timedelta(hours=1), at=later)

    # act: the batch, then status
    resolved, real = [], data_tasks.resolve_device
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data_tasks, "resolve_device", lambda name: resolved.append(name) or real(name))
        processed = clock.call("process", "--scenario", SCENARIO, at=later)
    [receipt] = read_receipts(workspace, SCENARIO)
    serving = current(workspace)
    status = clock.call("status", "--scenario", SCENARIO, at=later + timedelta(hours=2))
    return Urgent(workspace, urgent, later, processed, receipt, serving, status, resolved)


def test_a_batch_that_finds_the_latest_safe_time_passed_repays_in_the_same_run(urgent):
    # assert
    receipt = urgent.receipt
    assert urgent.processed.status == 0, urgent.processed.err
    assert receipt.forgetting == "interim" and receipt.exactly_forgotten is not None
    assert receipt.exactly_forgotten.at == urgent.later < receipt.exact_due
    assert urgent.serving.tags["forgetting"] == "exact" and "repaid in this run" in urgent.processed.out


def test_the_batch_and_its_repayment_run_on_the_device_the_command_chose_once(urgent):
    # assert: the retrain that repays the debt is handed the batch's device, not resolved again
    assert len(urgent.resolved) == 1, urgent.resolved


def test_after_a_repayment_in_the_batch_s_own_run_status_shows_the_request_forgotten_exactly(urgent):
    # assert
    assert urgent.status.status == 0, urgent.status.err
    assert status_row(urgent.status.out, urgent.urgent)[1] == "exact"


# --- with nothing pending, a debt past its latest safe start

@dataclass(frozen=True)
class Overdue:
    """An interim batch (deadline two days on) with no served deployment, so nothing runs at its
    latest safe start: `status` before and after that time, then `process` with nothing pending,
    then `status` again."""

    workspace: Path
    deadline: datetime
    receipt: Receipt                   # the batch's receipt right after it ran
    late: datetime                     # five minutes past the latest safe start
    before: Printed                    # `status` five minutes before the latest safe start
    warned: Printed                    # `status` at `late`
    processed: Printed                 # `process` at `late`, nothing pending
    repaid: ExactForgetting | None     # the batch's record of the repayment after it
    serving: object                    # the version `current` named after it
    after: Printed                     # `status` at `late`, after it


@pytest.fixture(scope="module")
def overdue(digits_hfl_template, prefect_server, tmp_path_factory) -> Overdue:
    # arrange
    workspace = trained_copy(digits_hfl_template, tmp_path_factory.mktemp("overdue"))
    clock, deadline = Clock(workspace), T0 + timedelta(days=2)
    request(clock, client=1, deadline=deadline)
    clock.ok("process", "--scenario", SCENARIO)
    [receipt] = read_receipts(workspace, SCENARIO)
    late = receipt.exact_start_by + timedelta(minutes=5)

    # act: status on either side of the latest safe start, process with nothing pending, status again
    before = clock.call("status", "--scenario", SCENARIO, at=receipt.exact_start_by - timedelta(minutes=5))
    warned = clock.call("status", "--scenario", SCENARIO, at=late)
    processed = clock.call("process", "--scenario", SCENARIO, at=late)
    repaid, serving = read_receipt(workspace, receipt.batch_id).exactly_forgotten, current(workspace)
    after = clock.call("status", "--scenario", SCENARIO, at=late)
    return Overdue(workspace, deadline, receipt, late, before, warned, processed, repaid, serving, after)


def test_an_interim_batch_s_latest_safe_start_is_before_its_deadline(overdue):
    # assert
    assert overdue.receipt.forgetting == "interim" and overdue.late < overdue.deadline


def test_before_the_latest_safe_start_status_says_what_to_run_by_when_without_a_warning(overdue):
    # assert
    before, receipt = overdue.before, overdue.receipt
    assert before.status == 0, before.err
    assert "WARNING" not in before.out
    # No repay-retrain-debt deployment is served here: status says so, and what to run by when (issue 37).
    assert (f"next exact retrain: none scheduled (no server serves repay-retrain-debt); run fedunlearn repay-debt "
            f"--scenario {SCENARIO} before {receipt.exact_start_by:%Y-%m-%d %H:%M}Z" in before.out)


def test_past_the_latest_safe_start_status_warns_and_says_what_to_run(overdue):
    """Warned from the latest safe start on, exit 0 until the deadline."""
    # assert
    warned, receipt = overdue.warned, overdue.receipt
    assert warned.status == 0, warned.err
    assert (f"WARNING: the exact retrain that repays the retrain debt should have started by "
            f"{receipt.exact_start_by:%Y-%m-%d %H:%M}Z" in warned.out and f"fedunlearn repay-debt --scenario {SCENARIO}"
            in warned.out and "**" not in warned.out)


def test_with_nothing_pending_a_debt_past_its_latest_safe_start_is_repaid(overdue):
    # assert
    assert overdue.processed.status == 0, overdue.processed.err
    out = overdue.processed.out
    assert "no pending requests" in out and "exact retrain repaid in this run" in out
    assert overdue.repaid is not None and overdue.repaid.at == overdue.late < overdue.deadline
    assert overdue.serving.tags["forgetting"] == "exact" and overdue.serving.tags["role"] == "retrained"


def test_once_the_debt_is_repaid_status_warns_no_more(overdue):
    # assert
    assert overdue.after.status == 0, overdue.after.err
    assert "WARNING" not in overdue.after.out


# --- strict

def test_strict_escalates_until_a_version_passes_every_check(trained):
    # arrange
    clock = Clock(trained)
    request(clock, client=1)

    # act
    processed = clock.call("process", "--scenario", SCENARIO, "--forgetting-policy", "strict")

    # assert
    assert processed.status == 0, processed.err
    [receipt] = read_receipts(trained, SCENARIO)
    *held_back, chosen = receipt.attempts
    assert receipt.policy == "strict"
    # The strict order, each attempt held back until one passes every check — or the exact retrain.
    assert [a.method for a in receipt.attempts] == STRICT_ESCALATION[:len(receipt.attempts)]
    assert held_back and all(not a.gates.passed for a in held_back)
    exact = chosen.method == "retrain"
    assert (exact and chosen.gates is None) or (not exact and chosen.gates.passed), chosen
    assert receipt.forgetting == ("exact" if exact else "interim")
    assert current(trained).tags["forgetting"] == receipt.forgetting
    measured = measured_on(Workspace.open(trained), SCENARIO, receipt.batch_id)
    assert measured[receipt.models["source"].version]["part"] == "source"
    assert measured[chosen.version.version]["part"] == ("retrained" if exact else "unlearned")


# --- a batch applied without unlearning (`ingest`), closed by `retrain`

@dataclass(frozen=True)
class Closed:
    """A request ingested (its data deleted, no model unlearned), then `fedunlearn retrain`: status
    before and after, and a `process` after it."""

    workspace: Path
    ingested: str                      # the request
    status_before: Printed             # `status` after the ingest
    retrained: Printed                 # `retrain`
    receipt: Receipt                   # the batch's receipt right after it
    serving: object                    # the version `current` named right after it
    data_version: str                  # the data version right after it
    measured: dict                     # the versions measured on the batch's forget set right after it
    status_after: Printed              # `status` after the retrain
    processed: Printed                 # `process` after it


@pytest.fixture(scope="module")
def closed(digits_hfl_template, prefect_server, tmp_path_factory) -> Closed:
    # arrange
    workspace = trained_copy(digits_hfl_template, tmp_path_factory.mktemp("closed"))
    clock = Clock(workspace)
    [ingested] = request(clock, client=0)
    clock.ok("ingest", "--scenario", SCENARIO)

    # act: status, the retrain, status, process
    status_before = clock.call("status", "--scenario", SCENARIO)
    retrained = clock.call("retrain", "--scenario", SCENARIO)
    [receipt] = read_receipts(workspace, SCENARIO)
    left = dict(receipt=receipt, serving=current(workspace), data_version=data_version(workspace, SCENARIO),
                measured=measured_on(Workspace.open(workspace), SCENARIO, receipt.batch_id))
    status_after = clock.call("status", "--scenario", SCENARIO)
    processed = clock.call("process", "--scenario", SCENARIO)
    return Closed(workspace, ingested, status_before, retrained, status_after=status_after, processed=processed,
                  **left)


def test_a_batch_applied_without_unlearning_has_deleted_the_data_but_not_yet_forgotten(closed):
    # assert
    assert closed.status_before.status == 0, closed.status_before.err
    assert status_row(closed.status_before.out, closed.ingested)[1] == "sample"  # data deleted, model not yet


def test_a_batch_applied_without_unlearning_is_closed_by_the_next_retrain(closed):
    # assert
    receipt, serving, measured = closed.receipt, closed.serving, closed.measured
    assert closed.retrained.status == 0, closed.retrained.err
    assert receipt.request_ids == [closed.ingested] and receipt.forgetting == "exact" and receipt.method == "retrain"
    assert serving.tags["role"] == "retrained" and serving.tags["data_version"] == closed.data_version
    assert receipt.models["current"].version == str(serving.version) and receipt.erasure["verified"]
    # the retrain, measured on the batch's forget set
    assert list(measured) == [str(serving.version)] and measured[str(serving.version)]["part"] == "retrained"
    assert math.isfinite(measured[str(serving.version)]["forget_acc"])


def test_once_closed_by_the_retrain_status_shows_the_request_forgotten_exactly(closed):
    # assert
    assert closed.status_after.status == 0, closed.status_after.err
    assert "no pending requests" in closed.status_after.out
    assert status_row(closed.status_after.out, closed.ingested)[1] == "exact"


def test_once_closed_by_the_retrain_process_finds_nothing_pending(closed):
    # assert
    assert closed.processed.status == 0, closed.processed.err
    assert "no pending requests" in closed.processed.out


# --- `fedunlearn retrain` racing `process`

@dataclass(frozen=True)
class Raced:
    """A batch during whose unlearning an exact retrain of the batch's data version was registered
    (as `fedunlearn retrain` registers it from another process, without the batch lock), then status."""

    workspace: Path
    retrain: ReferenceResult           # what the racing retrain registered
    processed: Printed                 # `process`
    receipt: Receipt                   # the batch's receipt right after it
    serving: object                    # the version `current` named right after it
    status: Printed                    # `status` after it


@pytest.fixture(scope="module")
def raced(digits_hfl_template, prefect_server, tmp_path_factory) -> Raced:
    from flows.reference import retrain_reference

    # arrange
    workspace = trained_copy(digits_hfl_template, tmp_path_factory.mktemp("raced"))
    clock = Clock(workspace)
    unlearn, racing = unlearn_stage.unlearn_in_gpu_slot, []

    def retrain_meanwhile(*args, **kwargs):
        if not racing:  # as `fedunlearn retrain` registers it from another process, without the batch lock
            racing.append(retrain_reference(scenario=SCENARIO, root=str(workspace), close_open=False))
        return unlearn(*args, **kwargs)

    request(clock, client=1)

    # act: the batch (the retrain racing it), then status
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(unlearn_stage, "unlearn_in_gpu_slot", retrain_meanwhile)
        processed = clock.call("process", "--scenario", SCENARIO)
    [receipt] = read_receipts(workspace, SCENARIO)
    serving = current(workspace)
    status = clock.call("status", "--scenario", SCENARIO)
    [retrain] = racing
    return Raced(workspace, retrain, processed, receipt, serving, status)


def test_an_exact_retrain_made_while_a_batch_ran_serves_and_the_batch_owes_nothing(raced):
    """`fedunlearn retrain` racing `process`: a retrain registered on the batch's data version while
    the batch unlearned serves (the batch owes nothing)."""
    # assert
    receipt, serving = raced.receipt, raced.serving
    assert raced.processed.status == 0, raced.processed.err
    assert str(serving.version) == raced.retrain.model_version and serving.tags["role"] == "retrained"
    assert receipt.forgetting == "exact" and receipt.exact_due is None and receipt.models["current"].version == \
        str(serving.version) and receipt.exactly_forgotten.version == str(serving.version)
    assert receipt.models["unlearned"].version != str(serving.version)  # the interim version, registered, not served


def test_after_a_batch_an_exact_retrain_raced_status_shows_no_retrain_debt(raced):
    # assert
    assert raced.status.status == 0, raced.status.err
    assert "retrain debt: none" in raced.status.out


def test_a_retrain_that_gets_the_lock_only_after_the_batch_finished_changes_nothing(raced, tmp_path, monkeypatch):
    """A retrain that found the batch open and got the lock only after the batch finished neither
    moves `current` nor claims to close an empty list."""
    import flows.reference as reference_flow

    # arrange
    workspace = copy_workspace(raced.workspace, tmp_path / "workspace")
    serving = str(raced.serving.version)  # the racing retrain (the unlearned version retired once it served)
    open_batches, found_open = reference_flow.open_batches, []
    monkeypatch.setattr(reference_flow, "open_batches",  # open when asked first, closed once the lock is held
                        lambda ws, scenario: open_batches(ws, scenario) if found_open else found_open.append(1) or [1])

    # act
    retrained = Clock(workspace).call("retrain", "--scenario", SCENARIO)

    # assert
    assert retrained.status == 0, retrained.err
    assert "closes the batch" not in retrained.out and str(current(workspace).version) == serving


# --- where membership is measurable (digits-canary-hfl)

def test_where_membership_is_measurable_the_interim_tier_refuses_a_no_op(trained_canaries, prefect_server,
                                                                        monkeypatch):
    """digits-canary-hfl memorises its mislabelled canaries: the source model's audit finds them
    (a measurable signal), so a stand-in method that changes nothing — a test double, not in the
    registry — fails the audit at every attempt and the batch ends on the exact retrain."""
    from fedunlearn.certify.certificate import EMPIRICAL_ONLY, Certificate
    from fedunlearn.federation.cost import Cost
    from fedunlearn.unlearning.base import Outcome
    from memorising import SCENARIO as CANARIES, canary_request_ids

    # arrange
    def no_op(setup, state, method, source_test_acc, options):
        return Outcome(state, Cost(0.0, 0.0, 0)), Certificate(method=method, guarantee=EMPIRICAL_ONLY,
                                                                     claimed=EMPIRICAL_ONLY)

    workspace, _ = trained_canaries  # train_memorising_workspace ran in it
    clock = Clock(workspace)
    monkeypatch.setattr(unlearn_stage, "unlearn_in_gpu_slot", no_op)
    clock.ok("request", "samples", "--scenario", CANARIES, "--ids", *canary_request_ids(workspace, 40))

    # act
    processed = clock.call("process", "--scenario", CANARIES)

    # assert
    assert processed.status == 0, processed.err
    [receipt] = read_receipts(workspace, CANARIES)
    *refused, chosen = receipt.attempts
    assert refused[0].method == "fedquit"  # the source remembers the canaries: the removal method goes first
    assert refused and all(a.gates.interim is False and any(line.startswith("forget_audit fails: AUC")
                                                            for line in a.gates.held_back) for a in refused)
    assert chosen.method == "retrain" and receipt.forgetting == "exact"
    source_checks = {c.name: c.verdict for c in receipt.source_gates.checks}
    assert source_checks["forget_audit"] == "fail"  # the source model's own audit: not forgotten
    assert Registry(workspace).by_alias(CANARIES, "current").tags["role"] == "retrained"


def test_where_membership_is_measurable_a_retrain_quality_candidate_serves_on_the_interim_tier(
        trained_canaries, prefect_server, monkeypatch):
    """The other branch of the same gate: a stand-in method whose output *is* an exact retrain on the
    retained data (a test double standing in for whichever method the batch tries first — here
    ``fedquit``, as the source remembers the canaries — certified only ``empirical only``) is read by
    the audit as equivalent to never-seen samples, so the interim tier serves it although the
    one-sided audit cannot call it forgotten at 40 canaries."""
    import dataclasses

    from fedunlearn.certify.certificate import EMPIRICAL_ONLY, Certificate
    from fedunlearn.federation.cost import Cost
    from fedunlearn.training import train
    from fedunlearn.unlearning.base import Outcome
    from memorising import SCENARIO as CANARIES, canary_request_ids

    # arrange
    def retrain_quality(setup, state, method, source_test_acc, options):
        federation = setup.fed_state
        retrained = train(dataclasses.replace(federation, clients=federation.retained_clients(setup.batch), state={}))
        return Outcome(retrained.state, Cost(0.0, 0.0, 0)), Certificate(method=method, guarantee=EMPIRICAL_ONLY,
                                                                               claimed=EMPIRICAL_ONLY)

    workspace, _ = trained_canaries
    clock = Clock(workspace)
    monkeypatch.setattr(unlearn_stage, "unlearn_in_gpu_slot", retrain_quality)
    clock.ok("request", "samples", "--scenario", CANARIES, "--ids", *canary_request_ids(workspace, 40))

    # act
    processed = clock.call("process", "--scenario", CANARIES)

    # assert
    assert processed.status == 0, processed.err
    [receipt] = read_receipts(workspace, CANARIES)
    [served] = receipt.attempts
    assert served.method == "fedquit" and served.gates.interim is True and receipt.forgetting == "interim"
    assert served.gates.audit_equivalence.verdict == "pass"
    assert {c.name: c.verdict for c in receipt.source_gates.checks}["forget_audit"] == "fail"
    assert "mia_auc_minus_chance" not in {c.name for c in served.gates.checks}  # canaries: the audit reads them
    assert Registry(workspace).by_alias(CANARIES, "current").tags["role"] == "unlearned"


def test_an_exact_retrain_per_batch_runs_no_approximate_attempt(trained):
    """The honest baseline of the month of traffic (``process --method retrain``): the batch's one
    attempt is the exact retrain."""
    # arrange
    clock = Clock(trained)
    request(clock, 1)

    # act
    processed = clock.call("process", "--scenario", SCENARIO, "--method", "retrain")

    # assert
    assert processed.status == 0, processed.err
    [receipt] = read_receipts(trained, SCENARIO)
    assert [a.method for a in receipt.attempts] == ["retrain"] and receipt.forgetting == "exact"
    assert current(trained).tags["role"] == "retrained"
