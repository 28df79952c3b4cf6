"""Retirement (issue 46) end to end, ``make reliability`` only (each case trains, processes or restores
through DVC and the CLI: a minute or more each). ``make test`` checks the same pieces in process on
facts and a trained copy: tests/test_retirement.py.

A memorising scenario (digits-canary-hfl) asked to forget canaries: after ``process`` and
``repay-debt`` every version that learnt them is retired — unloadable through the project's registry
and through MLflow's own loader, its metrics kept, no store holding its weights. And a workspace
restored from a snapshot pushed before a retirement does not get the weights back."""

from __future__ import annotations

import os

import pytest

FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = pytest.mark.skipif(not FULL, reason="make reliability only: make test covers the pieces in process "
                                                 "(tests/test_retirement.py)")


def test_a_memorising_scenario_forgotten_exactly_retires_every_version_that_learnt_it(trained_canaries,
                                                                                      prefect_server):
    import mlflow

    from fedunlearn.receipts import read_receipts
    from memorising import SCENARIO, canary_request_ids
    from stores.registry import VersionRetired, retired_batch
    from stores.workspace import Workspace
    from tasks.receipts import comparison
    from tasks.retirement import weights_check
    from workspaces import call_cli

    workspace, _ = trained_canaries
    asked = call_cli(workspace, "request", "samples", "--scenario", SCENARIO, "--ids",
                     *canary_request_ids(workspace, 40))
    assert asked.status == 0, asked.err
    processed = call_cli(workspace, "process", "--scenario", SCENARIO)
    assert processed.status == 0, processed.err
    repaid = call_cli(workspace, "repay-debt", "--scenario", SCENARIO)
    assert repaid.status == 0, repaid.err

    ws = Workspace.open(workspace)
    [receipt] = read_receipts(workspace, SCENARIO)
    assert receipt.forgetting == "exact" or receipt.exactly_forgotten is not None  # by the batch or the repayment
    learnt = [v for v in ws.registry.versions(SCENARIO)
              if v.tags.get("data_version") == receipt.data_version_before or v.tags.get("role") == "unlearned"]
    assert learnt and [v.version for v in learnt if not retired_batch(v)] == []
    assert receipt.retired == [str(v.version) for v in learnt]
    rows = {str(row["version"]): row for row in comparison(ws, SCENARIO)[0]}
    for version in learnt:
        with pytest.raises(VersionRetired, match=receipt.batch_id):
            ws.registry.load(SCENARIO, str(version.version))
        with pytest.raises(Exception):  # MLflow's own loader: the model's files are gone
            mlflow.pytorch.load_model(f"models:/{SCENARIO}/{version.version}")
        row = rows[str(version.version)]
        assert row["retired"] == f"retired by {receipt.batch_id}" and row["test_acc"] is not None
    check = weights_check(ws)
    assert check.retired_versions_checked >= len(learnt) and check.weights_clean, check.weights_found
def test_restoring_a_snapshot_from_before_the_retirement_brings_no_weights_back(trained_digits_hfl, tmp_path):
    """`fedunlearn restore` from a snapshot pushed while v1 still had its weights: a snapshot holds
    state files only, the registry keeps the tombstone, so v1 stays unloadable, named as retired."""
    from fedunlearn.requests import erasure
    from stores.registry import Registry, VersionRetired
    from stores.workspace import Workspace, run_dvc
    from tasks.retirement import retire_forgotten
    from test_retirement import SCENARIO, owe_one_exact_batch
    from workspaces import call_cli

    root, remote, restored = trained_digits_hfl, tmp_path / "dvc-remote", tmp_path / "restored"
    run_dvc(root, ["remote", "add", "-d", "storage", str(remote)])
    assert call_cli(root, "push").status == 0  # the old snapshot: v1 not yet retired
    batch_id = owe_one_exact_batch(root)
    ws = Workspace.open(root)
    ws.registry.remove_alias(SCENARIO, "current")
    assert retire_forgotten.fn(ws, SCENARIO).versions == {"1": batch_id}

    printed = call_cli(restored, "restore", "--dvc-remote", str(remote), "--mlflow-tracking-uri", ws.registry.uri)

    assert printed.status == 0, printed.err
    assert f"{SCENARIO}: retired, their weights gone and not restored: v1 (by {batch_id})" in printed.out
    with pytest.raises(VersionRetired, match=batch_id):
        Registry(restored).load(SCENARIO, "1")
    key = erasure.fingerprint_key(root)
    matcher = erasure.WindowMatcher(key, erasure.retired_windows(root, key)[0])
    assert [p for p in erasure.files_under([restored, remote]) if matcher.owners_in(p.read_bytes())] == []
