"""Durable stores (issue 18, item 4): a digits-hfl workspace with a local-directory DVC remote and a
real `mlflow server` on 127.0.0.1 (its own sqlite backend and proxied artifact store), driven by the
CLI. A batch whose push fails stops before `current` moves and resumes; the resumed batch pushes its
data version and state, moves `current` — and the workspace is lost before the receipt. `fedunlearn
restore` rebuilds it from the remote and the server: the ledger verifies, the next run finishes the
interrupted batch from its registered version, the one after applies only the new request (a
resubmitted old one is recognised as applied) and `current` is a version of the new data version.
Last, `ingest --purge` removes the deleted rows from the remote too (`dvc gc --cloud`), the erasure
scan covers it, and a restore from the purged remote gets the newest state."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

import flows.promote as promote_stage
from cli import main
from fedunlearn.receipts import read_receipt
from fedunlearn.requests import erasure
from fedunlearn.requests.batch import load_records
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
from stores import durable
from stores.durable import STATE_DIR, set_tracking_uri
from stores.registry import Registry
from stores.workspace import run_dvc
from stores.workspace import data_version
from test_serve_e2e import BIN, Service, Services, free_port

SCENARIO = "digits-hfl"


@contextmanager
def running_mlflow_server(tmp_path: Path, backend_store_uri: str | None = None):
    """`mlflow server` on a free port of 127.0.0.1 over ``backend_store_uri`` (default: sqlite in its
    store), artifacts served (proxied) from a directory of its own. Yields (tracking URI, its store
    directory, a function waiting until it answers: it starts while the Prefect server does);
    stopped with its workers."""
    store = tmp_path / "mlflow-server"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no GenAI job runner: two processes fewer
    port, log = free_port(), store / "server.log"
    server = subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri",
                               backend_store_uri or f"sqlite:///{store}/mlflow.db",
                               "--artifacts-destination", str(store / "artifacts"), "--serve-artifacts",
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=store,
                              start_new_session=True)
    service = Service("mlflow-server", server, log)
    uri = f"http://127.0.0.1:{port}"
    try:
        yield uri, store, lambda: Services(tmp_path, env).wait_for(f"{uri}/health", service)
    finally:
        service.stop()


@pytest.fixture
def mlflow_server(tmp_path: Path):
    """``running_mlflow_server`` on its sqlite backend."""
    with running_mlflow_server(tmp_path) as running:
        yield running


@pytest.mark.reliability  # slow end to end: `make reliability`
def test_a_lost_workspace_restored_from_the_dvc_remote_and_the_mlflow_server_continues_exactly_once(
        mlflow_server, workspace, prefect_server, tmp_path, capsys, monkeypatch):
    uri, server_store, wait_for_mlflow = mlflow_server
    remote = tmp_path / "dvc-remote"

    def cli(root: Path, *args: str, status: int = 0) -> str:
        code = main(["--root", str(root), *args])
        captured = capsys.readouterr()
        assert code == status, captured
        return captured.out if status == 0 else captured.err

    def on_remote(version: str) -> bool:
        return (remote / "files" / "md5" / version[:2] / f"{version[2:]}.dir").is_file()

    def unreachable(root, args):
        if args[0] == "push":
            raise durable.DvcError("`dvc push` failed: ERROR: failed to push data to the cloud - remote unreachable")
        return run_dvc(root, args)

    run_dvc(workspace, ["remote", "add", "-d", "storage", str(remote)])
    set_tracking_uri(workspace, uri)
    wait_for_mlflow()
    cli(workspace, "train", "--scenario", SCENARIO, "--inline")
    assert "pushed the data versions and the state snapshot" in cli(workspace, "push")
    original = Registry(workspace).by_alias(SCENARIO, "original")
    first_ids = cli(workspace, "ids", "--scenario", SCENARIO, "--client", "1", "--limit", "12").split()
    # The deleted rows as stored, read before they are deleted (memory only): the purge must take them
    # off the remote too.
    rows = erasure.take_fingerprints(erasure.stored_row_sources(workspace, "digits", [SCENARIO]), set(first_ids))
    first = cli(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *first_ids).strip()

    # 1. The remote fails: the batch stops after its ledger append and new data version, before
    # `current` moves, saying so; a re-run resumes it.
    monkeypatch.setattr(durable, "run_dvc", unreachable)
    err = cli(workspace, "process", "--scenario", SCENARIO, "--method", "retrain", status=1)
    assert "pushing the data versions and the state to the DVC remote 'storage'" in err and "again" in err, err
    assert [e.request_id for e in Ledger(workspace / LEDGER_PATH).entries()] == [first]
    assert Registry(workspace).by_alias(SCENARIO, "current") is None
    monkeypatch.undo()

    # 2. The resumed batch pushes, moves `current` — and the machine dies before the receipt is written.
    def lost(*args, **kwargs):
        raise RuntimeError("the disk is gone")

    monkeypatch.setattr(promote_stage, "write_receipt", lost)
    err = cli(workspace, "process", "--scenario", SCENARIO, "--method", "retrain", status=1)
    assert "failed at alias and receipt" in err, err
    monkeypatch.undo()
    [record] = load_records(RequestFolders(workspace))
    before, after = record.data_version_before, record.data_version_after
    registry = Registry(workspace)
    current = registry.by_alias(SCENARIO, "current")
    assert current.tags["data_version"] == after and current.tags["batch_id"] == record.batch_id
    batch_versions = {v.version for v in registry.versions(SCENARIO, batch_id=record.batch_id)}
    # Everything went to the durable stores: both data versions and the state on the DVC remote, the
    # runs and their artifacts on the MLflow server — nothing of MLflow in the workspace.
    assert on_remote(before) and on_remote(after) and list((remote / STATE_DIR).glob("*.tar"))
    assert not (workspace / "mlflow" / "artifacts").exists() and not (workspace / "mlflow" / "mlflow.db").exists()
    assert list((server_store / "artifacts").rglob("weights.pt"))
    applied_request = (workspace / "data/deletion_requests/processed" / f"{first}.json").read_bytes()

    # 3. The disaster: the workspace is gone. Restored from the remote and the server into a new directory;
    # the log's signing key is a secret no store holds, so the operator restores it from their own backup
    # (without it the next batch refuses to sign: tests/test_transparency_hardening.py).
    secrets_backup = tmp_path / "secrets-backup"
    shutil.copytree(workspace / ".secrets", secrets_backup)
    shutil.rmtree(workspace)
    restored = tmp_path / "restored"
    out = cli(restored, "restore", "--dvc-remote", str(remote), "--mlflow-tracking-uri", uri)
    shutil.copytree(secrets_backup, restored / ".secrets", dirs_exist_ok=True)
    assert "intact" in out and f"alias current -> v{current.version}" in out, out
    assert f"the data before unfinished batches: {SCENARIO}@{before[:10]}" in out, out  # the batch without receipt
    assert "intact" in cli(restored, "ledger", "verify")
    assert data_version(restored, SCENARIO) == after
    assert not set(first_ids) & set(cli(restored, "ids", "--scenario", SCENARIO).split())
    assert "pushed the data versions and the state snapshot" in cli(restored, "push")  # its own remote URL, MLflow URI

    # 4. A new request, and the first one submitted again. The next run finishes the interrupted batch
    # from its registered version (no new version, a receipt); the one after applies only the new request.
    second_ids = cli(restored, "ids", "--scenario", SCENARIO, "--client", "2", "--limit", "10").split()
    second = cli(restored, "request", "samples", "--scenario", SCENARIO, "--ids", *second_ids).strip()
    (restored / "data/deletion_requests/inbox" / f"{first}.json").write_bytes(applied_request)
    cli(restored, "process", "--scenario", SCENARIO, "--method", "retrain")
    resumed = read_receipt(restored, record.batch_id)
    assert resumed.request_ids == [first] and resumed.models["current"].version == current.version
    assert {v.version for v in Registry(restored).versions(SCENARIO, batch_id=record.batch_id)} == batch_versions
    out = cli(restored, "process", "--scenario", SCENARIO, "--method", "retrain")
    assert f"already applied, moved to processed/: {first}" in out

    assert [e.request_id for e in Ledger(restored / LEDGER_PATH).entries()] == [first, second]
    assert "intact" in cli(restored, "ledger", "verify")
    newest = read_receipt(restored, load_records(RequestFolders(restored))[-1].batch_id)
    assert newest.request_ids == [second] and newest.data_version_before == after and newest.promoted
    registry = Registry(restored)
    current = registry.by_alias(SCENARIO, "current")
    assert current.tags["data_version"] == newest.data_version_after == data_version(restored, SCENARIO)
    assert current.tags["batch_id"] == newest.batch_id
    # The original learnt the deleted rows and the exact retrains forgot them: retired, its record kept.
    kept = registry.version(SCENARIO, str(original.version))
    assert kept.tags.get("retirement") == "retired" and "original" not in registry.aliases(SCENARIO)
    mlflow_scan = next(s for s in newest.erasure["stores"] if s["name"] == "mlflow")
    assert not mlflow_scan["in_scope"] and uri in mlflow_scan["note"]

    # 5. The remote still holds the rows of the first request (the data versions before it) until a
    # purge: `ingest --purge` runs `dvc gc --cloud`, and the erasure scan covers the local remote.
    assert erasure.verify_erasure(rows, [erasure.Store("dvc-remote", [remote])], restored).found
    third_ids = cli(restored, "ids", "--scenario", SCENARIO, "--client", "0", "--limit", "5").split()
    cli(restored, "request", "samples", "--scenario", SCENARIO, "--ids", *third_ids)
    cli(restored, "ingest", "--scenario", SCENARIO, "--purge")
    purged = load_records(RequestFolders(restored))[-1]
    remote_scan = next(s for s in purged.erasure.stores if s.name == "dvc-remote")
    assert purged.erasure.verified and remote_scan.in_scope and remote_scan.files > 0 and not remote_scan.found
    assert not erasure.verify_erasure(rows, [erasure.Store("dvc-remote", [remote])], restored).found
    assert not any(on_remote(v) for v in (before, after, newest.data_version_after))
    assert on_remote(purged.data_version_after)
    # The versions' examples, read back through the server, are zeros: none is marked as holding rows.
    assert not [v.version for v in Registry(restored).versions(SCENARIO) if "erasure" in v.tags]
    # ... and the purged state is on the remote: a restore from it gets the newest data version and ledger.
    again = tmp_path / "restored-again"
    cli(again, "restore", "--dvc-remote", str(remote))
    assert data_version(again, SCENARIO) == purged.data_version_after
    assert len(Ledger(again / LEDGER_PATH).entries()) == 3
    assert "not an empty directory" in cli(again, "restore", "--dvc-remote", str(remote), status=2)


def test_the_state_snapshot_is_pushed_once_never_over_a_newer_remote_and_taken_only_as_written(workspace, tmp_path):
    """The snapshot itself, without servers: pushed when the state changed, refused by a workspace
    behind the remote, a failing remote named, a damaged or foreign snapshot never restored."""
    import io
    import tarfile

    from fedunlearn.errors import StateDamaged
    from fedunlearn.requests.batch import BatchRecord, BatchStatus
    from fedunlearn.requests.ledger import LedgerEntry
    from stores.workspace import init_workspace, reproduce

    def entry(request_id: str) -> LedgerEntry:
        return LedgerEntry(request_id=request_id, batch_id="b1", scenario=SCENARIO, kind="sample",
                           subject={"sample_ids": ["digits-00001"]}, sample_ids=["digits-00001"])

    remote = tmp_path / "remote"
    run_dvc(workspace, ["remote", "add", "-d", "storage", str(remote)])
    assert durable.push_state(workspace) is None and not durable.stale(workspace)  # no data version yet
    version = reproduce(workspace, SCENARIO)
    appended = Ledger(workspace / LEDGER_PATH).append([entry("r1")])
    BatchRecord(batch_id="b1", scenario=SCENARIO, dataset="digits", status=BatchStatus.COMPLETE, requests=appended,
                ledger_appended=["r1"]).save(RequestFolders.create(workspace))  # an entry's batch has its record
    assert durable.stale(workspace)
    name = durable.push_state(workspace)
    assert name and not durable.stale(workspace) and durable.push_state(workspace) is None
    assert (remote / "files" / "md5" / version[:2] / f"{version[2:]}.dir").is_file()
    files = durable.read_snapshot((remote / STATE_DIR / name).read_bytes())
    assert set(files) == {"params.yaml", "dvc.yaml", "dvc.lock", ".dvc/config", LEDGER_PATH.as_posix(),
                          "data/deletion_requests/batches/b1.json", "data/transparency/log.pub"}  # not .secrets/
    assert files[LEDGER_PATH.as_posix()] == (workspace / LEDGER_PATH).read_bytes()

    # A workspace whose ledger does not extend the remote's would drop r1 there: it is refused.
    other = init_workspace(tmp_path / "other")
    run_dvc(other, ["remote", "add", "-d", "storage", str(remote)])
    reproduce(other, SCENARIO)
    with pytest.raises(durable.RemoteAhead, match="holds a newer state than this workspace"):
        durable.push_state(other)
    # A remote that cannot be written is named, with what to do.
    (tmp_path / "a-file").write_text("")
    run_dvc(other, ["remote", "add", "-d", "-f", "storage", str(tmp_path / "a-file" / "remote")])
    with pytest.raises(durable.RemoteUnavailable, match="'storage'.*run the same command again"):
        durable.push_state(other)

    # A snapshot changed on the remote is an error, never silently an older one; so is a foreign file in one.
    snapshot = remote / STATE_DIR / name
    snapshot.write_bytes(snapshot.read_bytes()[:-512])
    with pytest.raises(StateDamaged, match="does not read back as written"):
        durable.restore(tmp_path / "restored", str(remote))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(tarfile.TarInfo("../outside"), io.BytesIO(b""))
    with pytest.raises(StateDamaged, match="not a file of a workspace's state"):
        durable.read_snapshot(buffer.getvalue())
