"""A full disk is reported as one wherever it surfaces (issue 26): Python's errno 28, torch's zip
writer, SQLite, DVC, the Prefect server's HTTP 500 — each exit 7 with the path or filesystem and the
command to run again; a text that only *may* mean a full disk counts when the filesystem is indeed
full (the free-space probe is simulated). A registration that fails leaves no MLflow run RUNNING."""

import sqlite3
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch
from dvc.exceptions import DvcException
from mlflow import MlflowClient
from prefect.exceptions import PrefectHTTPStatusError

from cli import main
from fedunlearn import errors
from fedunlearn.errors import BatchFailed, NoSpace, as_no_space, is_no_space, no_space_path
from stores.registry import ModelWeights, Registry, tracking_uri

RESUME = "`fedunlearn process --scenario digits-hfl`"
TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A filesystem with almost nothing free: everything under ``tmp_path/full``; others roomy."""
    full = tmp_path / "full"
    full.mkdir()
    monkeypatch.setattr(errors, "free_bytes", lambda path: 700 * 1024 if Path(path).is_relative_to(full) else 10**12)
    return full


def roomy(monkeypatch):
    monkeypatch.setattr(errors, "free_bytes", lambda path: 10**12)


def raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """``error`` as raised (``from cause``), with its traceback and chain."""
    try:
        raise error from cause
    except BaseException as err:
        return err


def http_500() -> PrefectHTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1:4200/api/task_runs/x/set_state")
    response = httpx.Response(500, json={"exception_message": "Internal Server Error"}, request=request)
    return PrefectHTTPStatusError.from_httpx_error(
        httpx.HTTPStatusError("Server error '500 Internal Server Error'", request=request, response=response))


def sqlite_full(path: Path) -> sqlite3.OperationalError:
    """A real SQLITE_FULL: a database allowed too few pages says what a full disk says."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA max_page_count = 2")
    try:
        db.execute("CREATE TABLE t (x BLOB)")
        db.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    except sqlite3.OperationalError as err:
        return err
    finally:
        db.close()
    raise AssertionError("sqlite accepted a row past max_page_count")


def assert_no_space(err: BaseException, where: str, *paths: Path) -> None:
    full = as_no_space(err, RESUME, *paths)
    assert isinstance(full, NoSpace) and full.exit_code == 7
    assert f"no space left on device ({where}" in str(full) and RESUME in str(full)


def test_errno_28_names_the_file_it_could_not_write(tmp_path, monkeypatch):
    roomy(monkeypatch)  # errno 28 needs no confirmation: the kernel said so
    target = tmp_path / "mlflow" / "artifacts" / "weights.pt"
    assert_no_space(raised(OSError(28, "No space left on device", str(target))), str(target))
    wrapped = raised(BatchFailed("batch-b1 failed at ingest"), raised(OSError(28, "No space left on device",
                                                                            str(target))))
    assert_no_space(wrapped, str(target))  # anywhere in the chain


def test_torch_serializer_failure_counts_only_on_a_full_filesystem(full_disk, tmp_path, monkeypatch):
    err = raised(RuntimeError(TORCH_FULL))
    errors.watch_filesystems(full_disk)
    assert_no_space(err, str(full_disk), full_disk)
    assert "the filesystem mounted at" in no_space_path(err, full_disk) and "0.7 MiB free" in no_space_path(err)
    roomy(monkeypatch)
    assert no_space_path(err, full_disk) is None and not is_no_space(err)  # room everywhere: another failure


def test_sqlite_database_or_disk_is_full(full_disk, tmp_path, monkeypatch):
    err = sqlite_full(full_disk / "mlflow.db")
    assert "database or disk is full" in str(err)
    assert_no_space(raised(RuntimeError("(sqlite3.OperationalError) database or disk is full"), err), str(full_disk),
                    full_disk)
    roomy(monkeypatch)  # here the page limit, not the disk, was full: not reported as a full disk
    assert as_no_space(err, RESUME, full_disk) is None


def test_dvc_errors_wrapping_enospc(tmp_path, monkeypatch):
    roomy(monkeypatch)
    cache = tmp_path / ".dvc" / "cache" / "files" / "md5" / "ab"
    assert_no_space(raised(DvcException("failed to commit"), OSError(28, "No space left on device", str(cache))),
                    str(cache))
    assert is_no_space(raised(DvcException("[Errno 28] No space left on device: 'data/raw'")))
    assert not is_no_space(raised(DvcException("failed to commit: stage not found")))


def test_prefect_http_500_on_a_full_prefect_home(full_disk, monkeypatch):
    home = full_disk / "prefect-home"
    home.mkdir()
    monkeypatch.setenv("PREFECT_HOME", str(home))
    err = raised(http_500())
    assert "500" in str(err) and "no space" not in str(err).lower()
    assert_no_space(err, str(home))
    # The batch's own NoSpace, hidden in the context of the HTTP 500 raised while Prefect recorded the
    # failure (700 KB free), is the message: it names the path and how to resume.
    try:
        try:
            raise NoSpace(f"batch-b1 failed at ingest: no space left on device ({home / 'x.db'}); run {RESUME}")
        except NoSpace:
            raise http_500()
    except PrefectHTTPStatusError as top:
        assert str(as_no_space(top, "`fedunlearn other`")).startswith("batch-b1 failed at ingest: no space")
    monkeypatch.setattr(errors, "free_bytes", lambda path: 10**12)
    assert as_no_space(err, RESUME) is None  # a 500 with room on every disk is not a full disk


def test_a_nospace_naming_only_the_scenario_gets_the_path_of_its_cause(tmp_path, monkeypatch):
    roomy(monkeypatch)
    target = tmp_path / ".tmp" / "reference_0.pt"
    err = raised(NoSpace(f"batch b1 (digits-hfl) failed: no space left on device (digits-hfl); run {RESUME}"),
                 OSError(28, "No space left on device", str(target)))
    assert f"(at {target})" in str(as_no_space(err, RESUME))


def test_the_cli_exits_7_with_the_path_and_the_command(workspace, monkeypatch, capsys):
    monkeypatch.setattr(errors, "free_bytes", lambda path: 0 if Path(path).is_relative_to(workspace) else 10**12)

    def torch_full(args, root):
        raise RuntimeError(TORCH_FULL)

    monkeypatch.setattr("cli.data.run_prepare", torch_full)
    assert main(["--root", str(workspace), "prepare"]) == NoSpace.exit_code
    err = capsys.readouterr().err
    assert f"no space left on device ({workspace}: the filesystem mounted at" in err
    assert f"`fedunlearn --root {workspace} prepare` again" in err and "Traceback" not in err
    monkeypatch.setattr(errors, "free_bytes", lambda path: 10**12)
    with pytest.raises(RuntimeError, match="unexpected pos"):  # not a full disk: the error as it was
        main(["--root", str(workspace), "prepare"])


def run_statuses(workspace: Path, experiment: str) -> list[str]:
    client = MlflowClient(tracking_uri(workspace), tracking_uri(workspace))
    found = client.get_experiment_by_name(experiment)
    return [run.info.status for run in client.search_runs([found.experiment_id])]


def test_a_failed_registration_ends_its_mlflow_run_as_failed(workspace, monkeypatch):
    """The audit references' torch.save on a full disk (the run the issue found RUNNING), and a model
    version whose registration fails: each run ends FAILED, none is left RUNNING."""
    from tasks.audit import register_audit_set
    from tasks.models import register_version
    from stores.workspace import Workspace
    from fedunlearn.evaluation.records import VersionMetrics

    ws = Workspace.open(workspace)

    class References:  # what registering a reference set reads of one
        seconds, models = 1.0, [torch.nn.Linear(2, 2)]
        train_ids, pool_a_ids, pool = [np.array(["a"])], np.array(["b"]), SimpleNamespace(sample_ids=np.array(["c"]))

        def __len__(self) -> int:
            return len(self.models)

    references = References()

    def torch_full(*args, **kwargs):
        raise RuntimeError(TORCH_FULL)

    monkeypatch.setattr("tasks.audit.torch.save", torch_full)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        register_audit_set.fn(ws, "digits-hfl", references, "v1")
    assert run_statuses(workspace, "digits-hfl-audit") == ["FAILED"]
    assert ws.registry.open_runs("digits-hfl-audit") == []

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(workspace / "mlflow" / "artifacts"))

    monkeypatch.setattr(Registry, "register", disk_full)
    with pytest.raises(OSError):
        register_version.fn(ws, "digits-hfl", ModelWeights({}), torch.nn.Linear(2, 2), (2,),
                            {"role": "unlearned", "data_version": "v1", "batch_id": "b1"}, {}, VersionMetrics(), {})
    assert run_statuses(workspace, "digits-hfl") == ["FAILED"]
    assert ws.registry.open_runs("digits-hfl") == []
