"""Strength per batch (fedunlearn/unlearning/puf.py, "Strength per batch"; base.calibration_reached),
an option (``max_doublings``): with calibration rows — held-out samples the audit never uses as
non-members — PUF climbs its (E_u, η_u) ladder cheapest first and stops at the first rung whose
forget set's loss reaches the calibration rows'; a rung that reaches it runs recovery, a ladder that
never does stops before recovery. Both branches on digits-canary-hfl."""

import dataclasses

import numpy as np
import pytest
from memorising import canary_federation

from fedunlearn.evaluation.audit import audit_forgetting
from fedunlearn.federation.batch import DeletionBatch
from fedunlearn.unlearning import get_method
from fedunlearn.unlearning.base import calibration_reached


@pytest.fixture(scope="module")
def canaries(tmp_path_factory):
    return canary_federation(tmp_path_factory.mktemp("strength"))


def test_the_calibration_rows_are_the_references_pool_a_never_the_audits_non_members(canaries):
    federation, _, references, _ = canaries
    rows = federation.calibration.sample_ids
    assert len(rows) and np.isin(rows, references.pool_a_ids).all()
    assert not np.isin(rows, references.pool.sample_ids).any()


def ordinary_batch(federation, references, count: int = 40) -> DeletionBatch:
    """``count`` training samples that are not canaries, spread over the clients."""
    ids = np.concatenate([c.sample_ids for c in federation.clients])
    return DeletionBatch.for_sample_ids(ids[~references.canaries.of(ids)][::30][:count], federation.clients)


def test_a_step_that_reaches_the_level_stops_climbing_and_recovers(canaries):
    # Mislabelled canaries: the negated step lifts their mean loss above the calibration rows' at once.
    federation, _, _, batch = canaries
    outcome = get_method("puf-special", max_doublings=2, max_recovery_rounds=2).unlearn(federation, batch)
    [rung] = outcome.notes["strength"][:1]
    assert rung["reached"] and (rung["unlearn_epochs"], rung["eta_u"]) == (1, 2.0)
    assert outcome.notes["recovery_rounds"] >= 1
    assert (outcome.certificate_inputs["unlearn_epochs_used"], outcome.certificate_inputs["eta_u_used"]) == (1, 2.0)


def test_a_ladder_that_never_reaches_the_level_climbs_cheapest_first_and_stops_before_recovery(canaries):
    # Ordinary training samples sit below never-seen ones by the generalisation gap; the negated
    # update does not close it at any rung, so the method declines without paying for recovery.
    federation, training_cost, references, _ = canaries
    outcome = get_method("puf-special", max_doublings=2, max_recovery_rounds=10).unlearn(
        federation, ordinary_batch(federation, references))
    ladder = outcome.notes["strength"]
    assert len(ladder) == 9 and not any(rung["reached"] for rung in ladder)
    assert [rung["rung"] for rung in ladder] == list(range(9))
    assert [(r["unlearn_epochs"], r["eta_u"]) for r in ladder][:4] == [(1, 2.0), (1, 4.0), (1, 8.0), (2, 2.0)]
    assert outcome.notes["recovery_rounds"] == 0
    assert outcome.cost.flops < 0.05 * training_cost.flops


def test_without_calibration_rows_the_chosen_strength_is_used_as_in_the_paper(canaries):
    federation, _, _, batch = canaries
    plain = dataclasses.replace(federation, calibration=None)
    for method in (get_method("puf-special", max_doublings=2, max_recovery_rounds=0),  # no rows: no ladder
                   get_method("puf-special", max_recovery_rounds=0)):                   # the default: off
        outcome = method.unlearn(plain if method.max_doublings else federation, batch)
        assert outcome.notes["strength"] == [] and outcome.certificate_inputs["eta_u_used"] == 2.0
    with pytest.raises(ValueError, match="calibration rows"):
        calibration_reached(plain, federation.state, federation.forget_data(batch))


def test_the_audit_reads_no_calibration_row(canaries):
    federation, _, references, batch = canaries
    forget, model = federation.forget_data(batch), federation.model_from(federation.state)
    before = audit_forgetting(model, forget, references)
    federation.calibration = federation.calibration.select(np.arange(len(federation.calibration)) % 2 == 0)
    try:
        assert audit_forgetting(model, forget, references).auc == before.auc
    finally:
        federation.calibration = canaries[0].calibration
