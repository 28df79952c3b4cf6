"""The two-tier contract through the CLI, a temporary Prefect server, a real DVC repository and a
real sqlite MLflow registry, with an injected clock (``FEDUNLEARN_NOW``): an interim batch serves
an approximate version at once and Prefect holds a scheduled run of ``repay-retrain-debt`` at the
latest safe time; ``status`` exits 9 for a request left interim past its deadline; the repayment
(as that run would start it) forgets exactly before the deadline; a batch that finds the safe time
passed repays at once; ``strict`` escalates as before. Then a batch applied without unlearning and
closed by ``fedunlearn retrain``."""

import itertools
import math
import re
from datetime import datetime, timedelta, timezone

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
from prefect.runner import Runner

import flows.unlearn as unlearn_stage
from cli import main
from fedunlearn.receipts import read_receipt, read_receipts
from fedunlearn.requests.model import CLOCK_VARIABLE
from flows.debt import repay_retrain_debt
from stores.registry import Registry
from stores.workspace import Workspace, data_version
from tasks.forget_sets import measured_on
from workspaces import status_row

SCENARIO = "digits-hfl"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def clock_cli(workspace, capsys, monkeypatch):
    """The CLI at a simulated time: ``run(*args, at=..., status=0)`` returns what it printed."""
    def invoke(*args: str, at: datetime = T0, status: int = 0) -> str:
        monkeypatch.setenv(CLOCK_VARIABLE, at.isoformat())
        assert main(["--root", str(workspace), *args]) == status, capsys.readouterr()
        return capsys.readouterr().out
    return invoke


@pytest.fixture
def trained(trained_digits_hfl, prefect_server):
    """digits-hfl trained (a copy of the session's), with the session's Prefect server."""
    return trained_digits_hfl


@pytest.fixture
def run(trained, capsys, monkeypatch):
    return clock_cli(trained, capsys, monkeypatch)


def request(run, client: int, deadline: datetime | None = None, at: datetime = T0) -> list[str]:
    ids = run("ids", "--scenario", SCENARIO, "--client", str(client), "--limit", "12", at=at).split()
    extra = ["--deadline", deadline.isoformat()] if deadline else []
    return [run("request", "samples", "--scenario", SCENARIO, "--ids", *ids, *extra, at=at).strip()]


def current(workspace):
    return Registry(workspace).by_alias(SCENARIO, "current")


@pytest.fixture
def repayment_deployment(trained):
    """What `make serve` registers: the repay-retrain-debt deployment (its runner is not started),
    deleted after the test: the session's Prefect server is shared, and another test's status must
    not find it served."""
    deployment_id = Runner().add_flow(repay_retrain_debt, name="weekly",
                                      parameters={"root": str(trained), "scenario": SCENARIO})
    yield str(deployment_id)
    with get_client(sync_client=True) as client:
        client.delete_deployment(deployment_id)


def scheduled_repayments(deployment_id: str) -> list:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    return [r for r in runs if r.state and r.state.is_scheduled()]


def test_an_interim_batch_serves_at_once_and_the_exact_retrain_meets_the_deadline(trained, run, repayment_deployment):
    workspace, deployment_id = trained, repayment_deployment
    deadline = T0 + timedelta(days=2)
    [first] = request(run, client=1, deadline=deadline)

    out = run("process", "--scenario", SCENARIO)

    [receipt] = read_receipts(workspace, SCENARIO)
    serving = current(workspace)
    assert receipt.forgetting == "interim" and receipt.policy == "interim" and receipt.exact_due == deadline
    assert receipt.deadlines == {first: deadline} and receipt.exact_start_by < deadline
    assert serving.tags["forgetting"] == "interim" and serving.tags["role"] == "unlearned"
    assert serving.tags["data_version"] == receipt.data_version_after != receipt.data_version_before
    assert [a.method for a in receipt.attempts] == ["puf-special"] and receipt.attempts[0].gates.interim
    assert not Registry(workspace).versions(SCENARIO, role="retrained")  # no exact retrain in the batch
    assert receipt.source_gates is not None
    assert f"alias current -> v{serving.version} (puf-special, " in out  # the reason on the line that says it serves
    assert next(line for line in out.splitlines() if line.startswith("alias current ->")).count(
        "serves on the interim tier — no check failed") == 1 and "; exact forgetting due by" in out
    assert "serves on the **interim** tier" in receipt.markdown()
    [scheduled] = scheduled_repayments(deployment_id)
    assert scheduled.expected_start_time == receipt.exact_start_by
    assert scheduled.parameters["scenario"] == SCENARIO

    interim = run("status", "--scenario", SCENARIO, at=T0 + timedelta(days=1))
    assert status_row(interim, first)[1] == "interim"
    run("status", "--scenario", SCENARIO, at=deadline + timedelta(hours=1), status=9)

    run("repay-debt", "--scenario", SCENARIO, at=receipt.exact_start_by)  # what the scheduled run starts

    repaid = read_receipt(workspace, receipt.batch_id).exactly_forgotten
    assert repaid.at == receipt.exact_start_by < deadline
    assert current(workspace).tags["forgetting"] == "exact" and current(workspace).tags["role"] == "retrained"
    assert status_row(run("status", "--scenario", SCENARIO, at=deadline + timedelta(hours=1)), first)[1] == "exact"
    compared_on_the_forget_set(workspace, receipt, run("compare", "--scenario", SCENARIO))


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


def test_a_batch_that_finds_the_latest_safe_time_passed_repays_in_the_same_run(trained, run):
    workspace = trained
    later = T0 + timedelta(days=3)
    [urgent] = request(run, client=2, deadline=later + timedelta(hours=1), at=later)

    result = run("process", "--scenario", SCENARIO, at=later)

    [receipt] = read_receipts(workspace, SCENARIO)
    assert receipt.forgetting == "interim" and receipt.exactly_forgotten is not None
    assert receipt.exactly_forgotten.at == later < receipt.exact_due
    assert current(workspace).tags["forgetting"] == "exact" and "repaid in this run" in result
    assert status_row(run("status", "--scenario", SCENARIO, at=later + timedelta(hours=2)), urgent)[1] == "exact"


def test_with_nothing_pending_a_debt_past_its_latest_safe_start_is_warned_of_and_repaid(trained, run):
    """No served deployment, so nothing runs at the latest safe start: ``status`` warns from then on
    (exit 0 until the deadline), and the next ``process`` with nothing pending repays the debt."""
    workspace = trained
    deadline = T0 + timedelta(days=2)
    request(run, client=1, deadline=deadline)
    run("process", "--scenario", SCENARIO)
    [receipt] = read_receipts(workspace, SCENARIO)
    late = receipt.exact_start_by + timedelta(minutes=5)
    assert receipt.forgetting == "interim" and late < deadline

    before = run("status", "--scenario", SCENARIO, at=receipt.exact_start_by - timedelta(minutes=5))
    assert "WARNING" not in before
    # No repay-retrain-debt deployment is served here: status says so, and what to run by when (issue 37).
    assert (f"next exact retrain: none scheduled (no server serves repay-retrain-debt); run fedunlearn repay-debt "
            f"--scenario {SCENARIO} before {receipt.exact_start_by:%Y-%m-%d %H:%M}Z" in before)
    warned = run("status", "--scenario", SCENARIO, at=late)
    assert (f"WARNING: the exact retrain that repays the retrain debt should have started by "
            f"{receipt.exact_start_by:%Y-%m-%d %H:%M}Z" in warned and f"fedunlearn repay-debt --scenario {SCENARIO}"
            in warned and "**" not in warned)

    out = run("process", "--scenario", SCENARIO, at=late)

    assert "no pending requests" in out and "exact retrain repaid in this run" in out
    repaid = read_receipt(workspace, receipt.batch_id).exactly_forgotten
    assert repaid is not None and repaid.at == late < deadline
    assert current(workspace).tags["forgetting"] == "exact" and current(workspace).tags["role"] == "retrained"
    assert "WARNING" not in run("status", "--scenario", SCENARIO, at=late)


def test_strict_escalates_until_a_version_passes_every_check(trained, run):
    workspace = trained
    request(run, client=1)

    run("process", "--scenario", SCENARIO, "--forgetting-policy", "strict")

    [receipt] = read_receipts(workspace, SCENARIO)
    chosen = receipt.attempts[-1]
    assert receipt.policy == "strict"
    assert all(not a.gates.passed for a in receipt.attempts[:-1])
    assert chosen.method == "retrain" or chosen.gates.passed
    assert receipt.forgetting == ("exact" if chosen.method == "retrain" else "interim")
    assert current(workspace).tags["forgetting"] == receipt.forgetting
    measured = measured_on(Workspace.open(workspace), SCENARIO, receipt.batch_id)
    assert measured[receipt.models["source"].version]["part"] == "source"
    assert measured[chosen.version.version]["part"] == ("retrained" if chosen.method == "retrain" else "unlearned")


def test_a_batch_applied_without_unlearning_is_closed_by_the_next_retrain(trained, run):
    workspace = trained
    [ingested] = request(run, client=0)
    run("ingest", "--scenario", SCENARIO)
    assert status_row(run("status", "--scenario", SCENARIO), ingested)[1] == "sample"  # data deleted, model not yet

    run("retrain", "--scenario", SCENARIO)

    [receipt] = read_receipts(workspace, SCENARIO)
    serving = current(workspace)
    assert receipt.request_ids == [ingested] and receipt.forgetting == "exact" and receipt.method == "retrain"
    assert serving.tags["role"] == "retrained" and serving.tags["data_version"] == data_version(workspace, SCENARIO)
    assert receipt.models["current"].version == str(serving.version) and receipt.erasure["verified"]
    measured = measured_on(Workspace.open(workspace), SCENARIO, receipt.batch_id)  # the retrain on its forget set
    assert list(measured) == [str(serving.version)] and measured[str(serving.version)]["part"] == "retrained"
    assert math.isfinite(measured[str(serving.version)]["forget_acc"])
    status = run("status", "--scenario", SCENARIO)
    assert "no pending requests" in status and status_row(status, ingested)[1] == "exact"
    assert "no pending requests" in run("process", "--scenario", SCENARIO)


def test_an_exact_retrain_made_while_a_batch_ran_serves_and_a_late_retrain_changes_nothing(trained, run,
                                                                                            monkeypatch):
    """`fedunlearn retrain` racing `process`: a retrain registered on the batch's data version while the
    batch unlearned serves (the batch owes nothing); a retrain that found the batch open and got the lock
    only after the batch finished neither moves `current` nor claims to close an empty list."""
    import flows.reference as reference_flow
    from flows.reference import retrain_reference

    workspace = trained
    unlearn, raced = unlearn_stage.unlearn_in_gpu_slot, []

    def retrain_meanwhile(*args, **kwargs):
        if not raced:  # as `fedunlearn retrain` registers it from another process, without the batch lock
            raced.append(retrain_reference(scenario=SCENARIO, root=str(workspace), close_open=False))
        return unlearn(*args, **kwargs)

    monkeypatch.setattr(unlearn_stage, "unlearn_in_gpu_slot", retrain_meanwhile)
    request(run, client=1)
    run("process", "--scenario", SCENARIO)

    [receipt] = read_receipts(workspace, SCENARIO)
    serving = current(workspace)
    assert raced and str(serving.version) == raced[0].model_version and serving.tags["role"] == "retrained"
    assert receipt.forgetting == "exact" and receipt.exact_due is None and receipt.models["current"].version == \
        str(serving.version) and receipt.exactly_forgotten.version == str(serving.version)
    assert receipt.models["unlearned"].version != str(serving.version)  # the interim version, registered, not served
    assert "retrain debt: none" in run("status", "--scenario", SCENARIO)

    open_batches, found_open = reference_flow.open_batches, []
    monkeypatch.setattr(unlearn_stage, "unlearn_in_gpu_slot", unlearn)
    monkeypatch.setattr(reference_flow, "open_batches",  # open when asked first, closed once the lock is held
                        lambda ws, scenario: open_batches(ws, scenario) if found_open else found_open.append(1) or [1])
    registry = Registry(workspace)
    registry.set_alias(SCENARIO, "current", receipt.models["unlearned"].version)  # as if the batch had served it
    out = run("retrain", "--scenario", SCENARIO)
    assert "closes the batch" not in out and str(current(workspace).version) == receipt.models["unlearned"].version


def test_where_membership_is_measurable_the_interim_tier_refuses_a_no_op(trained_canaries, prefect_server,
                                                                        capsys, monkeypatch):
    """digits-canary-hfl memorises its mislabelled canaries: the source model's audit finds them
    (a measurable signal), so a stand-in method that changes nothing — a test double, not in the
    registry — fails the audit at every attempt and the batch ends on the exact retrain."""
    from fedunlearn.certify.certificate import EMPIRICAL_ONLY, Certificate
    from fedunlearn.federation.cost import CostRecord
    from fedunlearn.unlearning.base import Outcome
    from memorising import SCENARIO as CANARIES, canary_request_ids

    def no_op(setup, state, method, source_test_acc, options):
        return Outcome(state, CostRecord(0.0, 0.0, 0)), Certificate(method=method, guarantee=EMPIRICAL_ONLY,
                                                                     claimed=EMPIRICAL_ONLY)

    workspace, _ = trained_canaries  # train_memorising_workspace ran in it
    run = clock_cli(workspace, capsys, monkeypatch)
    monkeypatch.setattr(unlearn_stage, "unlearn_in_gpu_slot", no_op)
    run("request", "samples", "--scenario", CANARIES, "--ids", *canary_request_ids(workspace, 40))

    run("process", "--scenario", CANARIES)

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
        trained_canaries, prefect_server, capsys, monkeypatch):
    """The other branch of the same gate: a stand-in method whose output *is* an exact retrain on the
    retained data (a test double standing in for whichever method the batch tries first — here
    ``fedquit``, as the source remembers the canaries — certified only ``empirical only``) is read by
    the audit as equivalent to never-seen samples, so the interim tier serves it although the
    one-sided audit cannot call it forgotten at 40 canaries."""
    import dataclasses

    from fedunlearn.certify.certificate import EMPIRICAL_ONLY, Certificate
    from fedunlearn.federation.cost import CostRecord
    from fedunlearn.training import train
    from fedunlearn.unlearning.base import Outcome
    from memorising import SCENARIO as CANARIES, canary_request_ids

    def retrain_quality(setup, state, method, source_test_acc, options):
        federation = setup.fed_state
        retrained = train(dataclasses.replace(federation, clients=federation.retained_clients(setup.batch), state={}))
        return Outcome(retrained.state, CostRecord(0.0, 0.0, 0)), Certificate(method=method, guarantee=EMPIRICAL_ONLY,
                                                                               claimed=EMPIRICAL_ONLY)

    workspace, _ = trained_canaries
    run = clock_cli(workspace, capsys, monkeypatch)
    monkeypatch.setattr(unlearn_stage, "unlearn_in_gpu_slot", retrain_quality)
    run("request", "samples", "--scenario", CANARIES, "--ids", *canary_request_ids(workspace, 40))

    run("process", "--scenario", CANARIES)

    [receipt] = read_receipts(workspace, CANARIES)
    [served] = receipt.attempts
    assert served.method == "fedquit" and served.gates.interim is True and receipt.forgetting == "interim"
    assert served.gates.audit_equivalence.verdict == "pass"
    assert {c.name: c.verdict for c in receipt.source_gates.checks}["forget_audit"] == "fail"
    assert "mia_auc_minus_chance" not in {c.name for c in served.gates.checks}  # canaries: the audit reads them
    assert Registry(workspace).by_alias(CANARIES, "current").tags["role"] == "unlearned"


def test_an_exact_retrain_per_batch_runs_no_approximate_attempt(trained, run):
    """The honest baseline of the month of traffic (``process --method retrain``): the batch's one
    attempt is the exact retrain."""
    request(run, 1)
    run("process", "--scenario", SCENARIO, "--method", "retrain")
    [receipt] = read_receipts(trained, SCENARIO)
    assert [a.method for a in receipt.attempts] == ["retrain"] and receipt.forgetting == "exact"
    assert current(trained).tags["role"] == "retrained"
