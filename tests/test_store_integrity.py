"""The sequences of issue "Erasure that covers every store…", tried as a user would through the CLI
on one digits-hfl workspace (a temporary Prefect server, a real DVC repository and sqlite MLflow):

1. test rows deleted with `ingest --purge`: every store scanned (MLflow and Prefect included) and
   clean — registered examples are zeros, not test rows;
2. `process` after that purge stops naming `fedunlearn retrain`, which then unblocks it;
3. a torn last ledger line of a completed batch stops the next run, un-deletes nothing, and
   `fedunlearn ledger repair` restores it; a damaged batch record and a missing weights artifact
   name themselves and their remedy;
4. a batch deleting every training sample says it can never produce a model, removes `current`
   and is not retried.
Plus the messages for a full disk, without filling one."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient

from cli import main
from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
from fedunlearn.errors import BatchCannotSucceed, ErasureNotVerified, NoSpace, StateDamaged
from fedunlearn.receipts import read_receipt
from fedunlearn.requests.batch import load_records
from fedunlearn.requests.folders import RequestFolders
from stores import workspace as workspaces
from stores.registry import ModelArtifactMissing, Registry, tracking_uri

SCENARIO = "digits-hfl"
EVERY_STORE = {"data", "receipts", "dvc-cache", "mlflow", "prefect", "temporary files", "model caches",
               "benchmark outputs"}


def files_holding(root: Path, rows: set[bytes]) -> list[str]:
    """Independent of the code under test: every file under ``root`` holding one of ``rows`` as bytes."""
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink()
            and any(row in p.read_bytes() for row in rows)]


@pytest.mark.reliability  # slow end to end: `make reliability`
def test_erasure_and_integrity_sequences_through_the_cli(trained_digits_hfl, prefect_server, capsys):
    workspace = trained_digits_hfl  # `fedunlearn train --scenario digits-hfl --inline` ran in it

    def cli(*args: str, status: int = 0) -> tuple[str, str]:
        assert main(["--root", str(workspace), *args]) == status, capsys.readouterr()
        captured = capsys.readouterr()
        return captured.out, captured.err

    folders = RequestFolders.create(workspace)
    test = load_horizontal(SCENARIO, workspace).test
    test_rows = {test.features[k].tobytes() for k in range(2)}

    # 1. The first two test rows, deleted and purged: no store holds them, MLflow and Prefect included.
    cli("request", "samples", "--scenario", SCENARIO, "--ids", *test.sample_ids[:2].tolist())
    out, _ = cli("ingest", "--scenario", SCENARIO, "--purge")
    record = load_records(folders)[-1]
    assert record.erasure.verified and "erasure verified" in out
    assert {s.name for s in record.erasure.stores if s.in_scope} == EVERY_STORE
    assert next(s for s in record.erasure.stores if s.name == "mlflow").files > 5  # the original's artifacts
    for store in ("mlflow", str(prefect_server), ".tmp", "data", ".dvc"):
        assert not files_holding(workspace / store if not store.startswith("/") else Path(store), test_rows), store

    # 2. The data moved on without a model and the data before it is purged: `process` says to retrain ...
    ids = load_horizontal(SCENARIO, workspace).clients[1].sample_ids[:6].tolist()
    cli("request", "samples", "--scenario", SCENARIO, "--ids", *ids)
    _, err = cli("process", "--scenario", SCENARIO, status=BatchCannotSucceed.exit_code)
    assert "fedunlearn retrain --scenario digits-hfl" in err and "purged" in err
    assert len(list(folders.inbox.iterdir())) == 1  # the new request waits
    cli("retrain", "--scenario", SCENARIO)
    out, _ = cli("process", "--scenario", SCENARIO)  # ... and after the retrain it unlearns from that version
    receipt = read_receipt(workspace, load_records(folders)[-1].batch_id)
    assert receipt.models["source"].role == "retrained" and receipt.erasure["verified"]
    assert [s["name"] for s in receipt.erasure["stores"] if not s["in_scope"]] == ["dvc-cache"]  # not purged

    cli("retrain", "--scenario", SCENARIO)  # a model on the new data whether or not the gates promoted the version

    # 3. A torn last line of that completed batch: the next run stops and changes nothing ...
    ledger = workspace / LEDGER_PATH
    written = ledger.read_bytes()
    ledger.write_bytes(written[:-20])
    cli("request", "client", "--scenario", SCENARIO, "--client", "0")
    lock = (workspace / "dvc.lock").read_bytes()
    _, err = cli("process", "--scenario", SCENARIO, status=StateDamaged.exit_code)
    assert str(ledger) in err and receipt.batch_id in err and "fedunlearn ledger repair" in err
    assert ledger.read_bytes() == written[:-20] and (workspace / "dvc.lock").read_bytes() == lock
    out, _ = cli("ledger", "verify", status=StateDamaged.exit_code)
    assert f"of {receipt.batch_id} (" in out and "NOT droppable" in out and "batch batch-" not in out
    out, _ = cli("ledger", "repair")
    assert ledger.read_bytes() == written and out.strip().endswith("intact")
    assert set(ids) <= Ledger(ledger).deleted_ids()

    # ... a damaged batch record names itself, and `ledger repair` rebuilds it from the ledger ...
    record_file = folders.batches / f"{receipt.batch_id}.json"
    record_file.write_text(record_file.read_text()[:100])
    _, err = cli("process", "--scenario", SCENARIO, status=StateDamaged.exit_code)
    assert f"the record of {receipt.batch_id}" in err and str(record_file) in err and "fedunlearn ledger repair" in err
    cli("ledger", "repair")
    cli("process", "--scenario", SCENARIO)  # the rebuilt record resumes (idempotently), then client 0 goes

    # ... and a version whose weights are gone names itself and what to run.
    client = MlflowClient(tracking_uri(workspace), tracking_uri(workspace))
    retrained = client.get_model_version_by_alias(SCENARIO, "retrained")
    weights = Path(client.get_run(retrained.run_id).info.artifact_uri.removeprefix("file://")) / "weights/weights.pt"
    moved = weights.with_suffix(".moved")
    weights.rename(moved)
    with pytest.raises(ModelArtifactMissing, match=rf"digits-hfl v{retrained.version} .*weights/weights.pt.*"
                                                   "fedunlearn retrain"):
        Registry(workspace).load(SCENARIO, alias="retrained")
    moved.rename(weights)

    # 4. Every remaining training sample deleted: said once, `current` removed, not retried.
    for client_index in (1, 2):
        cli("request", "client", "--scenario", SCENARIO, "--client", str(client_index))
    cli("retrain", "--scenario", SCENARIO)
    _, err = cli("process", "--scenario", SCENARIO, status=BatchCannotSucceed.exit_code)
    assert "deleted every training sample" in err and "fedunlearn train" in err
    last = read_receipt(workspace, load_records(folders)[-1].batch_id)
    assert last.outcome == "no model" and last.models["current"] is None
    assert "current" not in client.get_registered_model(SCENARIO).aliases
    out, _ = cli("process", "--scenario", SCENARIO)
    # The receipted batch's record is closed, nothing is unlearned again; the interim batches before
    # it still owe their exact forgetting, and the run says so.
    assert "no pending requests" in out.splitlines() and f"finished {last.batch_id}" in out
    again = read_receipt(workspace, last.batch_id)  # its end steps may add the versions they retired
    assert (again.outcome, again.models, again.created_at) == (last.outcome, last.models, last.created_at)


def test_a_full_disk_is_named_with_the_path_and_how_to_resume(workspace, monkeypatch, capsys):
    from dvc.exceptions import DvcException

    def failing_dvc(*args, **kwargs):
        return subprocess.CompletedProcess(args, 255, "", "")  # DVC's ENOSPC often prints nothing at all

    def failing_commit(*args, **kwargs):
        raise DvcException("")  # in process too

    monkeypatch.setattr(workspaces.subprocess, "run", failing_dvc)
    monkeypatch.setattr("dvc.repo.Repo.commit", failing_commit)
    monkeypatch.setattr(workspaces.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 4096))
    with pytest.raises(NoSpace, match=r"no space left on device \(.*workspace: 0 MiB free\) while running `dvc "
                                      r"commit.*run the same command again"):
        workspaces.reproduce(workspace, SCENARIO)
    with pytest.raises(NoSpace, match=r"while running `dvc gc --workspace --force`"):
        workspaces.garbage_collect(workspace)

    def full(args, root):
        raise OSError(28, "No space left on device", str(workspace / "data" / "raw"))

    monkeypatch.setattr("cli.data.run_prepare", full)
    assert main(["--root", str(workspace), "prepare"]) == NoSpace.exit_code
    assert "no space left on device (" + str(workspace / "data" / "raw") in capsys.readouterr().err


def test_every_exit_status_is_distinct_and_listed_in_the_readme():
    from fedunlearn.errors import EXIT_CODES

    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES) and ErasureNotVerified.exit_code == 6
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name, code in EXIT_CODES.items():
        assert f"| {code} | `{name}` |" in readme, name
    assert np.all(np.diff(sorted(EXIT_CODES.values())) == 1)
