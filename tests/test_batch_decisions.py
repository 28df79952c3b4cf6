"""The batch's decisions (fedunlearn.batch_decisions) without Prefect or a workspace: every route, when
the escalation stops, the tier fields, the receipt assembled from an outcome."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from fedunlearn.batch_decisions import (UNCHANGED, BatchUnlearning, NoModelFits, Owed, OwedFacts, RegisteredAttempt,
                                        Route, exact_certificate, metrics_of, owed, recorded_source, route)
from fedunlearn.batch_receipts import (certificate_record, receipt_closed_by_retrain, receipt_for,
                                       receipt_without_model, speedup, tier_fields, TierFields)
from fedunlearn.retrain_debt import (DebtAction, debt_action, late_start, racing_retrain, reference_to_reuse,
                                     retrain_closes_open)
from fedunlearn.certify.certificate import EMPIRICAL_ONLY, EXACT_RETRAIN, Certificate
from fedunlearn.certify.gates import GateOutcome
from fedunlearn.certify.tiers import stops
from fedunlearn.config import ForgettingPolicy
from fedunlearn.evaluation.records import VersionMetrics
from fedunlearn.federation.cost import Cost
from fedunlearn.receipts import NO_MODEL, EscalationStep, ModelRef
from fedunlearn.requests.batch import BatchRecord, BatchStatus, VersionChange
from fedunlearn.requests.ledger import LedgerEntry

SCENARIO = "digits-hfl"
DUE = datetime(2026, 12, 20, tzinfo=timezone.utc)


def record() -> BatchRecord:
    entries = [LedgerEntry(request_id=f"r{i}", batch_id="b1", scenario=SCENARIO, kind="sample",
                           sample_ids=[f"s{i}"]) for i in range(2)]
    return BatchRecord(batch_id="b1", scenario=SCENARIO, dataset="digits", status=BatchStatus.COMPLETE,
                       requests=entries, data_versions={SCENARIO: VersionChange(before="v0", after="v1")})


def ref(version: str, role: str) -> ModelRef:
    return ModelRef(version=version, role=role, data_version="v1", run_id=f"run{version}")


def gates(passed: bool, interim: bool | None) -> GateOutcome:
    return GateOutcome(passed=passed, policy="p", checks=[], verdict="pass" if passed else "inconclusive",
                       interim=interim)


@pytest.mark.parametrize("refits, held_out, forget, training, expected", [
    (False, False, 10, 100, Route.escalate),
    (True, False, 10, 100, Route.escalate),          # the transform refits, but no held-out sample went
    (True, True, 10, 100, Route.exact_only),         # training and held-out samples: features moved
    (False, True, None, 100, Route.keep_source),     # only held-out samples, the transform stays
    (True, True, None, 100, Route.retrain_for_new_features),
    (False, False, 100, 100, Route.no_model),        # every training sample deleted
    (True, True, 120, 100, Route.no_model),
])
def test_route_of_a_batch(refits, held_out, forget, training, expected):
    assert route(refits, held_out, forget, training) is expected


def test_a_resumed_batch_unlearns_from_the_source_its_registered_attempts_name():
    registered = {0: RegisteredAttempt(ref("4", "retrained")), 1: RegisteredAttempt(ref("5", "unlearned"), "7")}
    assert recorded_source(registered) == "7"
    assert recorded_source({0: RegisteredAttempt(ref("4", "retrained"))}) is None
    assert recorded_source({}) is None


def test_late_start_is_the_passed_start_and_nothing_while_there_is_time():
    start_by = DUE - timedelta(hours=30)
    assert late_start(start_by, start_by + timedelta(minutes=1)) == start_by
    assert late_start(start_by, start_by) == start_by
    assert late_start(start_by, start_by - timedelta(minutes=1)) is None
    assert late_start(None, DUE) is None  # nothing owed


def test_a_data_version_keeps_its_reference_and_the_last_one_is_kept():
    assert reference_to_reuse(["3", "12", "9"]) == "12"  # by number, not as text
    assert reference_to_reuse([]) is None


@pytest.mark.parametrize("retrained_on, current, open_batches, expected", [
    ("v1", "v1", 2, True),
    ("v1", "v2", 2, False),  # a batch moved the data while the retrain ran: a reference, nothing more
    ("v1", "v1", 0, False),  # a batch closed them meanwhile
])
def test_a_retrain_closes_the_open_batches_only_on_the_current_data(retrained_on, current, open_batches, expected):
    assert retrain_closes_open(retrained_on, current, open_batches) is expected


def test_a_racing_retrain_serves_and_the_batch_own_reference_does_not():
    assert racing_retrain({"4": "b1", "6": None, "11": "b0"}, "b1") == "11"
    assert racing_retrain({"4": "b1"}, "b1") is None  # the batch's own --retrain reference
    assert racing_retrain({}, "b1") is None


LAST = record()


def owed_facts(**changes) -> OwedFacts:
    base = dict(unfinished=None, last=LAST, last_receipted=False, last_has_versions=False, current="v1",
                aliases_on={"current": "v0", "original": "v0"}, before_cached=lambda: True,
                sibling_open=False)
    return OwedFacts(**{**base, **changes})


def test_the_owed_batch_tree_every_branch():
    unfinished = LAST.model_copy(update={"batch_id": "b2", "status": BatchStatus.VERSIONED})
    assert owed(owed_facts(unfinished=unfinished)) == Owed(unfinished)
    assert owed(owed_facts(last=None)) == Owed()
    assert owed(owed_facts(last_receipted=True)) == Owed()
    assert owed(owed_facts(current="v2")) == Owed()  # the data moved on since the last batch
    assert owed(owed_facts(last_has_versions=True)) == Owed(LAST)  # killed after registering
    assert owed(owed_facts(aliases_on={"current": "v0", "original": "v1"})) == Owed(closes_open="original")
    assert owed(owed_facts()) == Owed(LAST)  # a model on the data before it, cached: unlearned
    assert owed(owed_facts(before_cached=lambda: False, sibling_open=True)) == Owed(retrain_open=True)
    with pytest.raises(NoModelFits) as purged:
        owed(owed_facts(before_cached=lambda: False))
    assert purged.value.purged and purged.value.last.batch_id == "b1"
    with pytest.raises(NoModelFits) as none_fits:
        owed(owed_facts(aliases_on={"original": "v9"}))
    assert not none_fits.value.purged


@pytest.mark.parametrize("passed, interim, policy, expected", [
    (True, True, ForgettingPolicy.strict, True),
    (False, True, ForgettingPolicy.strict, False),     # strict escalates past an interim-only attempt
    (False, True, ForgettingPolicy.interim, True),
    (False, False, ForgettingPolicy.interim, False),   # held back on the interim tier too
])
def test_the_escalation_stops_at_the_first_attempt_that_may_serve(passed, interim, policy, expected):
    assert stops(gates(passed, interim), policy) is expected


def test_with_an_exact_retrain_in_hand_only_a_pass_ends_the_escalation():
    # process --retrain paid for the exact retrain already: an interim version would owe it again.
    assert not stops(gates(False, True), ForgettingPolicy.interim, exact_in_hand=True)
    assert stops(gates(True, True), ForgettingPolicy.interim, exact_in_hand=True)


def test_tier_fields_on_the_interim_tier_say_when_exact_forgetting_is_due_and_when_to_start():
    deadlines = {"r0": DUE, "r1": DUE + timedelta(days=3)}
    fields = tier_fields(deadlines, "empirical", ForgettingPolicy.interim, lambda due: due - timedelta(hours=8))
    assert fields.forgetting == "interim" and fields.policy == "interim" and fields.interim
    assert fields.exact_due == DUE and fields.exact_start_by == DUE - timedelta(hours=8)


def test_tier_fields_of_an_exact_retrain_owe_nothing():
    fields = tier_fields({"r0": DUE}, EXACT_RETRAIN, ForgettingPolicy.strict, lambda due: pytest.fail("not owed"))
    assert fields == TierFields("exact", "strict", {"r0": DUE}) and not fields.interim


@pytest.mark.parametrize("reference, chosen, expected", [
    (30.0, 10.0, 3.0), (None, 10.0, None), (math.nan, 10.0, None), (30.0, 0.0, None), (30.0, None, None)])
def test_speedup_against_retraining(reference, chosen, expected):
    assert speedup(reference, chosen) == expected


def outcome(method: str, with_reference: bool) -> BatchUnlearning:
    chosen = EscalationStep(attempt=1, method=method, version=ref("5", "unlearned"), certificate="empirical",
                           gates=gates(False, True), metrics=metrics_of(None, Cost(4.0, 1e9, 0)))
    first = EscalationStep(attempt=0, method="puf-special", version=ref("4", "unlearned"), certificate="empirical",
                          gates=gates(False, False), metrics={})
    reference = VersionMetrics(test_acc=0.9, wall_seconds=20.0, flops=1e10, comm_bytes=5) if with_reference else None
    return BatchUnlearning(ref("3", "original"), VersionMetrics(test_acc=0.95), [first, chosen],
                        Certificate(method=method, guarantee=EMPIRICAL_ONLY, claimed=EMPIRICAL_ONLY),
                        Cost(4.0, 1e9, 0), {"0": 1, "2": 1},
                        ref("6", "retrained") if with_reference else None, reference)


def test_the_receipt_names_the_chosen_attempt_every_model_and_the_cost_against_retraining():
    receipt = receipt_for(record(), outcome("puf-regular", True),
                          {"original": ref("3", "original"), "current": ref("5", "unlearned")},
                          {"verified": True}, TierFields("interim", "interim", {}), "batches/b1.json")
    assert receipt.method == "puf-regular" and receipt.promoted and receipt.request_ids == ["r0", "r1"]
    assert receipt.deleted_samples == 2 and receipt.forgotten_per_client == {"0": 1, "2": 1}
    assert receipt.models["unlearned"].version == "5" and receipt.models["retrained"].version == "6"
    assert receipt.models["current"].version == "5" and receipt.models["source"].version == "3"
    assert receipt.costs["speedup_vs_retrain"] == pytest.approx(5.0)
    assert receipt.costs["retrained"] == {"wall_seconds": 20.0, "flops": 1e10, "comm_bytes": 5}
    assert receipt.metrics["retrained"]["test_acc"] == 0.9 and len(receipt.attempts) == 2
    assert receipt.forgetting == "interim" and receipt.data_version_after == "v1"


STRICT_EXACT = TierFields("exact", "strict", {})


def test_a_receipt_without_a_reference_claims_no_speedup_and_an_exact_retrain_is_its_own_reference():
    unreferenced = receipt_for(record(), outcome("puf-regular", False), {}, {}, STRICT_EXACT, "b")
    assert unreferenced.costs["speedup_vs_retrain"] is None and unreferenced.models["retrained"] is None
    assert "retrained" not in unreferenced.costs and "retrained" not in unreferenced.metrics
    retrained = receipt_for(record(), outcome("retrain", False), {}, {}, STRICT_EXACT, "b")
    assert retrained.models["retrained"].version == "5"


def test_a_batch_that_deleted_everything_gets_a_receipt_with_no_model():
    receipt = receipt_without_model(record(), ref("3", "original"), ref("1", "original"), {"verified": True}, "b")
    assert receipt.outcome == NO_MODEL and not receipt.promoted and receipt.models["current"] is None
    assert receipt.models["source"].version == "3" and receipt.deleted_samples == 2


def test_metrics_of_report_what_was_not_measured_as_none_and_the_exact_certificate_says_why():
    metrics = metrics_of(None, Cost(2.0, math.nan, 0))
    assert metrics["wall_seconds"] == 2.0 and metrics["flops"] is None and metrics["test_acc"] is None
    certificate = exact_certificate(SCENARIO, "b1", "the escalation's last step")
    assert certificate.guarantee == EXACT_RETRAIN and "the escalation's last step" in certificate.notes[0]
    assert certificate_record(certificate) == {"method": "retrain", "guarantee": EXACT_RETRAIN,
                                               "claimed": EXACT_RETRAIN, "scenario": SCENARIO, "batch_id": "b1",
                                               "notes": certificate.notes}


def test_a_receipt_records_a_method_certificate_whole_and_an_unchanged_model_by_its_guarantee():
    method = Certificate(method="ga", guarantee=EMPIRICAL_ONLY, claimed=EMPIRICAL_ONLY, scenario=SCENARIO,
                         batch_id="b1", numbers={"steps": 3})
    unchanged = Certificate(method=UNCHANGED, guarantee=EXACT_RETRAIN, claimed=EXACT_RETRAIN, notes=["held out"])

    assert certificate_record(method) == json.loads(method.to_json())
    assert certificate_record(unchanged) == {"method": UNCHANGED, "guarantee": EXACT_RETRAIN}


@pytest.mark.parametrize("owed, start_by, expected", [
    (3, None, DebtAction.repay),                          # past requests.max_retrain_debt (2)
    (3, DUE - timedelta(hours=1), DebtAction.repay),      # past the most, and due: all of it at once
    (1, DUE - timedelta(hours=1), DebtAction.repay_due),  # its latest safe start has come: what is due
    (1, DUE + timedelta(hours=1), DebtAction.schedule),   # a run at its latest safe start
    (0, None, DebtAction.nothing),
])
def test_after_a_batch_the_retrain_debt_is_repaid_scheduled_or_left(owed, start_by, expected):
    assert debt_action(owed, 2, start_by, DUE) is expected


def test_a_batch_applied_without_unlearning_is_closed_by_the_retrain_that_serves():
    retrain = ref("4", "retrained")

    receipt = receipt_closed_by_retrain(record(), retrain, ref("1", "original"), {}, "repay-retrain-debt", DUE,
                                        {"r0": DUE}, "data/deletion_requests/batches/b1.json")

    assert receipt.method == "retrain" and receipt.forgetting == "exact" and receipt.promoted
    assert receipt.models["current"] == receipt.models["unlearned"] == receipt.models["retrained"] == retrain
    assert receipt.certificate == {"method": "retrain", "guarantee": EXACT_RETRAIN, "claimed": EXACT_RETRAIN,
                                   "notes": ["applied without unlearning; retrained from scratch on data version v1 "
                                             "(repay-retrain-debt)"]}
    assert receipt.exactly_forgotten.version == "4" and receipt.request_ids == ["r0", "r1"]


# --- which version repays earlier batches once a batch's receipt is written (flows.finish) -------------

def served(method: str, current: str = "5", exactly_by: str | None = None, outcome: str = "unlearned"):
    from fedunlearn.receipts import ExactForgetting, Receipt

    ref = ModelRef(version=current, role="retrained" if method == "retrain" else "unlearned", data_version="d1")
    done = ExactForgetting(at=datetime(2026, 1, 1, tzinfo=timezone.utc), version=exactly_by, by="retrain-reference") \
        if exactly_by else None
    return Receipt(batch_id="b", scenario="s", request_ids=["r"], deleted_samples=1, forgotten_per_client={},
                   data_version_before="d0", data_version_after="d1", method=method, outcome=outcome,
                   models={"current": ref if outcome != NO_MODEL else None}, promoted=True, metrics={}, costs={},
                   exactly_forgotten=done, batch_record="x")


@pytest.mark.parametrize("receipt, current, repays", [
    (served("retrain"), "5", "5"),                                # the batch's own exact retrain serves
    (served("puf-special", exactly_by="5"), "5", "5"),            # an exact retrain registered meanwhile serves
    (served("puf-special"), "5", None),                           # interim: it repays nothing
    (served("puf-special", exactly_by="7"), "5", None),           # repaid later by another version: not this batch's
    (served("retrain"), "6", None),                               # `current` moved on since
    (served("retrain", outcome=NO_MODEL), None, None),            # nothing serves
], ids=["own-retrain", "retrain-meanwhile", "interim", "repaid-later", "moved-on", "no-model"])
def test_the_version_a_receipted_batch_repays_earlier_batches_with(receipt, current, repays):
    from fedunlearn.retrain_debt import repaying_version

    assert repaying_version(receipt, current) == repays
