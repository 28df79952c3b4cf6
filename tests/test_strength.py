"""Strength per batch (fedunlearn/unlearning/puf.py and hf_kcu.py, "Strength per batch";
base.climb_ladder, base.calibration_reached), an option (``max_doublings``): with calibration rows —
held-out samples the audit never uses as non-members — PUF climbs its (E_u, η_u) ladder and HF-KCU
its (2^r·k CG steps, λ/2^r) ladder cheapest first, stopping at the first rung whose forget set's
loss reaches the calibration rows'. A rung that reaches it goes on (PUF: recovery; HF-KCU:
fine-tuning), a ladder that never does stops there; every rung climbed is paid for. Off by
default. Both branches of both methods on digits-canary-hfl.
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from memorising import canary_federation

from fedunlearn.evaluation.audit import audit_forgetting
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.cost import Cost
from fedunlearn.federation.local import Tensors
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


def ordinary_batch(federation, references, count: int = 40) -> ForgetSet:
    """``count`` training samples that are not canaries, spread over the clients."""
    from memorising import SCENARIO
    from fedunlearn.config import load_params
    from fedunlearn.data.partition import canary_mask

    params = load_params(Path(__file__).resolve().parent.parent / "params.yaml")
    ids = np.concatenate([c.sample_ids for c in federation.clients])
    planted = canary_mask(ids, params.seed, params.scenario(SCENARIO).partition.canary_fraction)
    return ForgetSet.for_sample_ids(ids[~planted][::30][:count], federation.clients)


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
    # Two doublings (η_u and E_u up to 2×): the gap stays wide at every rung, on any machine's floats
    # (at four doublings the last rung lands within float noise of the level).
    outcome = get_method("puf-special", max_doublings=1, max_recovery_rounds=10).unlearn(
        federation, ordinary_batch(federation, references))
    ladder = outcome.notes["strength"]
    assert len(ladder) == 4 and not any(rung["reached"] for rung in ladder)
    assert [rung["rung"] for rung in ladder] == list(range(4))
    assert [(r["unlearn_epochs"], r["eta_u"]) for r in ladder] == [(1, 2.0), (1, 4.0), (2, 2.0), (2, 4.0)]
    assert all(r["forget_loss"] < 0.8 * r["calibration_loss"] for r in ladder)  # far from the level
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


def test_the_audit_cannot_read_a_calibration_row(canaries):
    """What the audit reads is its arguments and the reference set: no federation reaches it, and
    the reference set's non-members (pool B) hold no calibration row — also after a request retired
    held-out rows (``AuditSet.without``), when pool A and pool B both shrink."""
    import inspect

    federation, _, references, _ = canaries
    assert not {"federation", "fed_state", "calibration"} & set(inspect.signature(audit_forgetting).parameters)
    retired = references.without(references.pool.sample_ids[:5])
    for kept in (references, retired):
        calibration = kept.calibration_rows(federation.test).sample_ids
        assert len(calibration) and not np.isin(kept.pool.sample_ids, calibration).any()
        assert np.isin(calibration, kept.pool_a_ids).all()


def hf_kcu_rung(federation, batch, rung: int, **options):
    """HF-KCU at ladder rung ``rung`` computed on its own: 2^rung·k CG steps at damping λ/2^rung, no ladder."""
    chosen = get_method("hf-kcu", **options)
    return get_method("hf-kcu", **{**chosen.get_params(), "max_doublings": 0, "finetune_rounds": 0,
                                   "cg_iterations": chosen.cg_iterations * 2 ** rung,
                                   "damping": chosen.damping / 2 ** rung}).unlearn(federation, batch)


def summed(outcomes) -> Cost:
    return sum((Cost(flops=o.cost.flops, comm_bytes=o.cost.comm_bytes) for o in outcomes), Cost())


def test_hf_kcu_climbs_until_a_rung_reaches_the_level_and_pays_for_every_rung(canaries):
    # Without the β cap, on ordinary samples, from 2 CG steps: the first rung leaves the forget loss
    # below the calibration rows', a later one (more CG steps, less damping) lifts it above and the
    # climb stops there. Which rung does is the machine's floats; the climb's rules are not.
    federation, _, references, _ = canaries
    batch = ordinary_batch(federation, references)
    chosen = {"beta": None, "cg_iterations": 2, "damping": 0.01}
    outcome = get_method("hf-kcu", **chosen, max_doublings=3, finetune_rounds=1).unlearn(federation, batch)
    ladder = outcome.notes["strength"]
    assert len(ladder) >= 2 and ladder[-1]["reached"] and not any(r["reached"] for r in ladder[:-1])
    assert [(r["rung"], r["cg_iterations"], r["damping"]) for r in ladder] == [
        (n, 2 * 2 ** n, pytest.approx(0.01 / 2 ** n)) for n in range(len(ladder))]
    assert ladder[-1]["forget_loss"] >= ladder[-1]["calibration_loss"]
    numbers = outcome.certificate_inputs
    assert (numbers["cg_iterations"], numbers["damping"]) == (ladder[-1]["cg_iterations"], ladder[-1]["damping"])
    assert outcome.notes["finetune_rounds"] == 1

    rungs = [hf_kcu_rung(federation, batch, r, **chosen) for r in range(len(ladder))]
    finetune = [h for h in outcome.history if h["phase"] == "finetune"]
    assert len(finetune) == 1 and outcome.cost.flops > summed(rungs).flops  # the rungs, plus one round
    without_finetune = get_method("hf-kcu", **chosen, max_doublings=3).unlearn(federation, batch)
    assert without_finetune.cost.flops == pytest.approx(summed(rungs).flops, rel=1e-12)


def test_hf_kcu_ladder_that_never_reaches_the_level_stops_at_max_doublings_without_fine_tuning(canaries):
    # The β cap keeps every rung's step small: the generalisation gap stays open at each.
    federation, _, references, _ = canaries
    batch = ordinary_batch(federation, references)
    outcome = get_method("hf-kcu", max_doublings=2, finetune_rounds=3).unlearn(federation, batch)
    ladder = outcome.notes["strength"]
    assert [(r["rung"], r["cg_iterations"], r["damping"]) for r in ladder] == [(0, 10, 0.01), (1, 20, 0.005),
                                                                                (2, 40, 0.0025)]
    assert not any(r["reached"] for r in ladder)
    assert all(r["forget_loss"] < r["calibration_loss"] for r in ladder)
    assert outcome.notes["finetune_rounds"] == 0
    assert not [h for h in outcome.history if h["phase"] == "finetune"]

    rungs = [hf_kcu_rung(federation, batch, r) for r in range(3)]
    assert outcome.cost.flops == pytest.approx(summed(rungs).flops, rel=1e-12)
    assert outcome.cost.comm_bytes == summed(rungs).comm_bytes
    assert outcome.cost.flops > 3 * rungs[0].cost.flops  # each rung dearer than the one before
    assert all(torch.equal(outcome.state[k], rungs[2].state[k]) for k in rungs[2].state)  # the last rung kept
    assert outcome.certificate_inputs == rungs[2].certificate_inputs


def test_the_canaries_mean_loss_is_above_the_level_before_any_step(canaries):
    # Why the criterion is off by default for both methods: mislabelled canaries pass it unremoved.
    federation, _, _, batch = canaries
    assert calibration_reached(federation, federation.state, federation.forget_data(batch)).reached
    outcome = get_method("hf-kcu", max_doublings=2).unlearn(federation, batch)
    assert [r["reached"] for r in outcome.notes["strength"]] == [True]


def test_hf_kcu_by_default_never_reads_the_calibration_rows(canaries):
    # max_doublings=0: the chosen k and λ, unjudged. Empty calibration rows would make any
    # judgement raise; the default runs on them, and with rows or without, gives the same step.
    federation, _, _, batch = canaries
    no_rows = Tensors(federation.calibration.x[:0], federation.calibration.y[:0], federation.calibration.sample_ids[:0])
    with pytest.raises(ValueError, match="calibration rows"):
        get_method("hf-kcu", max_doublings=1).unlearn(dataclasses.replace(federation, calibration=no_rows), batch)
    runs = [get_method("hf-kcu").unlearn(dataclasses.replace(federation, calibration=no_rows), batch),
            get_method("hf-kcu", max_doublings=0).unlearn(federation, batch),
            get_method("hf-kcu", max_doublings=3).unlearn(dataclasses.replace(federation, calibration=None), batch),
            hf_kcu_rung(federation, batch, 0)]
    for run in runs:
        assert run.notes["strength"] == []
        assert all(torch.equal(run.state[k], runs[0].state[k]) for k in runs[0].state)
        assert (run.cost.flops, run.cost.comm_bytes) == (runs[0].cost.flops, runs[0].cost.comm_bytes)
        assert run.certificate_inputs == runs[0].certificate_inputs


def test_hf_kcu_max_doublings_is_validated():
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="hf-kcu: max_doublings must be an integer >= 0"):
            get_method("hf-kcu", max_doublings=bad)
