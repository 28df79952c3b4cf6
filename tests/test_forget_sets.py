"""The comparison on one batch's forget set (``fedunlearn.evaluation.forget_sets``): which figures
become a run's plain metrics, at which step, and the comparison rows and header for one batch;
``compare --batch`` refusing a batch it has no receipt of. End to end (a batch, its debt repaid, the
three versions compared): tests/test_forgetting_tiers_flow.py."""

import math
from types import SimpleNamespace

from cli import main
from fedunlearn.evaluation.forget_sets import (FORGET_SET_METRICS, RETRAINED, SOURCE, UNLEARNED, batch_step,
                                               figures, header, on_forget_set, shown_on_run)
from fedunlearn.evaluation.records import Evaluation
from stores.registry.versions import run_name


def test_figures_carry_the_unlearned_runs_keys_and_nan_without_an_audit():
    evaluation = Evaluation(test_acc=0.9, retain_acc=0.95, forget_acc=0.975, mia_auc=0.49)
    audit = SimpleNamespace(auc=0.52, interval=(0.41, 0.63))

    audited = figures(evaluation, audit)
    unaudited = figures(evaluation, None)

    assert tuple(audited) == FORGET_SET_METRICS
    assert audited == {"forget_acc": 0.975, "mia_auc": 0.49, "audit_auc": 0.52, "audit_auc_low": 0.41,
                       "audit_auc_high": 0.63}
    assert unaudited["forget_acc"] == 0.975 and all(math.isnan(unaudited[k]) for k in FORGET_SET_METRICS[2:])


def test_only_the_original_as_source_and_a_retrain_without_the_samples_show_on_their_run():
    assert shown_on_run("original", SOURCE) and shown_on_run("retrained", RETRAINED)
    # An unlearned version's run shows its own batch; a later batch's source keeps its own role's figures.
    assert not shown_on_run("unlearned", SOURCE) and not shown_on_run("retrained", SOURCE)
    assert not shown_on_run("unlearned", UNLEARNED)


def test_a_batch_step_is_its_place_among_the_scenarios_batches():
    batches = ["batch-20260302T090000Z-aaaaaa", "batch-20260301T090000Z-bbbbbb", "batch-20260303T090000Z-cccccc"]

    assert [batch_step(batches, b) for b in batches] == [2, 1, 3]
    assert batch_step([], "batch-20260302T090000Z-aaaaaa") == 1


def test_the_forget_set_columns_hold_only_figures_on_the_batchs_forget_set():
    rows = [{"version": 1, "role": "original", "forget_acc": None, "test_acc": 0.9},
            {"version": 2, "role": "unlearned", "forget_acc": 0.5, "test_acc": 0.9},  # another batch's
            {"version": 3, "role": "unlearned", "forget_acc": 0.97, "test_acc": 0.9},
            {"version": 4, "role": "retrained", "forget_acc": None, "test_acc": 0.9}]
    measured = {"1": {"part": SOURCE, "forget_acc": 1.0, "mia_auc": 0.5, "audit_auc": 0.55},
                "3": {"part": UNLEARNED, "forget_acc": 0.97, "mia_auc": 0.48, "audit_auc": math.nan},
                "4": {"part": RETRAINED, "forget_acc": 0.96, "mia_auc": 0.47, "audit_auc": 0.5}}

    shown = on_forget_set(rows, measured)

    assert [r["forget_acc"] for r in shown] == [1.0, None, 0.97, 0.96]
    assert [r["forget_set_part"] for r in shown] == [SOURCE, None, UNLEARNED, RETRAINED]
    assert shown[2]["audit_auc"] is None and shown[0]["test_acc"] == 0.9  # NaN shown as none; the rest kept
    line = header("batch-x", 40, measured)
    assert line.startswith("forget_acc, mia_auc and audit_auc on the forget set of batch-x (40 samples): ")
    assert line.endswith("v1 (its source, trained on them), v3 (unlearned), v4 (retrained without them); – for the "
                         "other versions.")
    assert header("batch-x", 40, measured, rows=3).endswith("v4 (retrained without them).")


def test_runs_are_named_by_role_and_version():
    assert run_name("original", "1", "mnist5k-hfl", {}) == "original v1 · mnist5k-hfl"
    assert (run_name("unlearned", "2", "mnist5k-hfl", {"method": "puf-special", "batch_id": "batch-x"})
            == "unlearned v2 (puf-special) · batch-x")
    assert run_name("retrained", "3", "mnist5k-hfl", {}) == "retrained v3 · mnist5k-hfl"
    assert run_name("retrained", "4", "mnist5k-hfl", {"batch_id": "batch-y"}) == "retrained v4 · batch-y"


def test_compare_refuses_a_batch_it_has_no_receipt_of(workspace, capsys):
    assert main(["--root", str(workspace), "compare", "--scenario", "digits-hfl", "--batch", "batch-nope"]) == 2
    assert "no receipt of 'batch-nope'" in capsys.readouterr().err
