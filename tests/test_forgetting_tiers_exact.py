"""The two-tier contract through the CLI, continued (tests/test_forgetting_tiers_flow.py has the
interim batch, its scheduled repayment and the debt past its latest safe start; a file apart so that
the two halves run on two test workers): ``strict`` escalates until a version passes every check; a
batch applied without unlearning is closed by ``fedunlearn retrain``; an exact retrain registered
while a batch ran serves; where membership is measurable the interim tier refuses a no-op and serves
a retrain-quality candidate; ``process --method retrain`` runs no approximate attempt.

Each test reads as arrange, act, assert. A scenario of several commands in turn is run once for the
module by a fixture that returns a frozen record of what each command printed and left; its tests
only assert. A test that acts on such a scenario's workspace takes a copy."""

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

import flows.unlearn as unlearn_stage
from fedunlearn.receipts import Receipt, read_receipts
from flows.results import ReferenceResult
from stores.registry import Registry
from stores.workspace import Workspace, data_version
from tasks.forget_sets import measured_on
from tier_clock import SCENARIO, Clock, current, request, trained_copy
from workspaces import Printed, copy_workspace, status_row

# What a digits-hfl batch of client 1's samples tries under `strict`: every approximate attempt is
# held back (no check fails, none is passed either) and the exact retrain serves.
STRICT_ESCALATION = ["puf-special", "puf-special", "puf-regular", "fedquit", "fedquit", "retrain"]


@pytest.fixture
def trained(trained_digits_hfl, prefect_server):
    """digits-hfl trained (a copy of the session's), with the session's Prefect server."""
    return trained_digits_hfl


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
    # held back by the audit's evidence: the forget set's AUC shown above its band, or samples shown remembered
    assert refused and all(a.gates.interim is False and any(line.startswith(("forget_audit fails: AUC",
                                                                             "forget_audit_per_sample fails"))
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
        retrained = train(dataclasses.replace(federation, clients=federation.retained_clients(setup.forget_set), state={}))
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
