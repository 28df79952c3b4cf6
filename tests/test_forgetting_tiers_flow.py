"""The two-tier contract through the CLI, a temporary Prefect server, a real DVC repository and a
real sqlite MLflow registry, with an injected clock (``FEDUNLEARN_NOW``): an interim batch serves
an approximate version at once and Prefect holds a scheduled run of ``repay-retrain-debt`` at the
latest safe time; ``status`` exits 9 for a request left interim past its deadline; the repayment
(as that run would start it) forgets exactly before the deadline; a batch that finds the safe time
passed repays at once. ``strict``, a batch closed by ``fedunlearn retrain``, a retrain racing a batch
and the interim tier where membership is measurable: tests/test_forgetting_tiers_exact.py (a file
apart, so that the two halves run on two test workers).

Each test reads as arrange, act, assert. A scenario of several commands in turn (a batch, then
``status``, then the repayment, ...) is run once for the module by a fixture that returns a frozen
record of what each command printed and left; its tests only assert."""

import itertools
import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.runner import Runner

import tasks.data as data_tasks
from fedunlearn.receipts import ExactForgetting, Receipt, read_receipt, read_receipts
from flows.debt import repay_retrain_debt
from stores.registry import Registry
from tier_clock import SCENARIO, T0, Clock, current, request, trained_copy
from workspaces import Printed, status_row


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
    # One verdict per check everywhere: status reads the last attempt as the batch's attempts line did.
    reading = f"interim: serves; strict: {interim.receipt.attempts[-1].gates.verdict}"
    assert f"attempts: puf-special ({reading})" in interim.processed.out, interim.processed.out
    assert f"puf-special: {reading}, promoted, forgetting interim" in interim.status_interim.out


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
