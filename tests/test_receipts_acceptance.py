"""Issue 39's acceptance, as a data subject and as a dishonest operator would try it: a deletion
batch on digits-hfl (the CLI in this process, a real DVC repository and sqlite MLflow registry);
the subject's receipt verifies in a directory holding nothing but the receipt and the public key;
after the exact retrain the honest operator's `ledger prove-consistency` extends it; the tree head
is published to the DVC remote and MLflow; an operator who drops the request from the ledger and
signs a new head cannot produce a file that `verify-receipt --since <receipt>` accepts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedunlearn.receipts import read_receipts
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
from fedunlearn.transparency.log import LOG_DIR, TransparencyLog, sync_workspace
from stores.registry import Registry
from stores.transparency import EXPERIMENT, publish_tree_head
from stores.workspace import run_dvc
from workspaces import call_cli

SCENARIO = "digits-hfl"


@pytest.fixture
def batch(trained_digits_hfl, prefect_server):
    """digits-hfl after one interim deletion batch: (workspace, request ID, its sample IDs)."""
    workspace = trained_digits_hfl
    ids = call_cli(workspace, "ids", "--scenario", SCENARIO, "--client", "1", "--limit", "6").out.split()
    request_id = call_cli(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids).out.strip()
    processed = call_cli(workspace, "process", "--scenario", SCENARIO)
    assert processed.status == 0, processed.err
    return workspace, request_id, ids


def as_subject(directory: Path, monkeypatch, *args: str) -> tuple[int, str]:
    """`fedunlearn ARGS` run in ``directory``, which is not a workspace."""
    monkeypatch.chdir(directory)
    monkeypatch.delenv("FEDUNLEARN_ROOT", raising=False)
    printed = call_cli(directory, *args)
    return printed.status, printed.out + printed.err


def test_a_subject_verifies_alone_and_a_dishonest_operator_cannot_hide_a_dropped_request(batch, tmp_path,
                                                                                           monkeypatch):
    workspace, request_id, ids = batch
    # The batch itself signed a head that logs its ledger entries and its receipt, before anyone asked.
    logged = TransparencyLog(workspace).records()
    assert TransparencyLog(workspace).head() and len(logged) >= 2
    assert {r.kind for r in logged} >= {"deletion", "batch"}, {r.kind for r in logged}
    written = call_cli(workspace, "receipt", request_id, "--out", str(tmp_path / "r.tlog-proof"))
    assert written.status == 0, written.err
    subject = tmp_path / "subject"
    subject.mkdir()
    (subject / "receipt.tlog-proof").write_bytes((tmp_path / "r.tlog-proof").read_bytes())
    (subject / "log.pub").write_bytes((workspace / LOG_DIR / "log.pub").read_bytes())
    (subject / "my-ids.txt").write_text("\n".join(ids))
    status, out = as_subject(subject, monkeypatch, "verify-receipt", "receipt.tlog-proof", "--public-key", "log.pub",
                             "--ids", "my-ids.txt")
    [receipt] = read_receipts(workspace, SCENARIO)
    assert status == 0 and "VERIFIED" in out, out
    assert f"{receipt.data_version_before} -> {receipt.data_version_after}" in out and "forgetting interim" in out
    assert "model sha256 None" not in out and f"exact due {receipt.exact_due.isoformat()}" in out
    assert sorted(os.listdir(subject)) == ["log.pub", "my-ids.txt", "receipt.tlog-proof"]
    assert not set(ids) & set((subject / "receipt.tlog-proof").read_text().split())

    remote = tmp_path / "remote"
    run_dvc(workspace, ["remote", "add", "-d", "local", str(remote)])
    published = publish_tree_head(workspace)
    assert len(published.places) == 2, published.lines()
    assert (remote / "fedunlearn-state" / "transparency" / "checkpoint").read_text() == \
        TransparencyLog(workspace).head()
    runs = Registry(workspace).client.search_runs([Registry(workspace).experiment_id(EXPERIMENT)])
    assert runs and "transparency" in {a.path for a in Registry(workspace).client.list_artifacts(runs[0].info.run_id)}

    drop_and_resign(workspace, request_id)
    made = tmp_path / "consistency.tlog-proof"
    printed = call_cli(workspace, "ledger", "prove-consistency", "--since", str(subject / "receipt.tlog-proof"),
                       "--out", str(made))
    # The heads published to the remote and MLflow bind the log: nothing is signed over the rewrite (issue 47).
    assert printed.status == 4 and "nothing was signed" in printed.err and not made.exists(), printed
    # The subject's old proof presented with the operator's new head: the entry is not in it.
    old = (subject / "receipt.tlog-proof").read_text()
    forged = old.replace(old.partition("\n\n")[2], TransparencyLog(workspace).head())
    (subject / "forged.tlog-proof").write_text(forged)
    status, out = as_subject(subject, monkeypatch, "verify-receipt", "forged.tlog-proof", "--public-key", "log.pub",
                             "--since", "receipt.tlog-proof")
    assert status in (12, 13) and ("NOT in the log" in out or "INCONSISTENT" in out), out


def drop_and_resign(workspace: Path, request_id: str) -> None:
    """The dishonest operator: the request's entry dropped, the ledger chained anew without it, the
    Merkle log rebuilt from that ledger and signed with the workspace's own key."""
    ledger = Ledger(workspace / LEDGER_PATH)
    kept = [e.model_copy(update={"checksum": None, "prev_hash": None}) for e in ledger.entries()
            if e.request_id != request_id]
    ledger.path.write_text("")
    ledger.append(kept)
    for path in (workspace / LOG_DIR).glob("*"):
        if path.name != "log.pub":
            path.unlink()
    sync_workspace(workspace)
