"""Issue 26, item 5: every message names what failed and what to run; bad input exits 2 without a
traceback. A YAML syntax error in params.yaml, `ingest` in a workspace never prepared, a batch whose
model step fails after its deletion is applied (the message says the data IS changed), and a CSV
dataset with a missing ID or label, a cell that is not a finite number, or an ID given twice."""

import re
from datetime import datetime, timezone

import pytest
import yaml

from cli import main
from fedunlearn.config import load_params
from fedunlearn.data.datasets import load_csv, load_source
from fedunlearn.data.store import read_manifest
from fedunlearn.errors import InputError, NoSpace, StateDamaged
from fedunlearn.requests.batch import BatchRecord, BatchStatus, VersionChange
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import submit_request
from fedunlearn.requests.ledger import LedgerEntry
from fedunlearn.requests.model import DeletionRequestModel

SCENARIO = "digits-hfl"


def run(root, *args: str) -> int:
    return main(["--root", str(root), *args])


def test_a_yaml_syntax_error_in_params_names_the_file_line_and_column_and_exits_2(workspace, capsys):
    params = workspace / "params.yaml"
    lines = params.read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("scenarios:"))
    lines.insert(at + 1, "  broken: [1, 2")  # an unclosed bracket
    params.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=rf"{params} is not valid YAML at line \d+, column \d+: .*Fix the syntax"):
        load_params(params)
    assert run(workspace, "prepare", "--scenario", SCENARIO) == InputError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(params) in err and "line " in err and "Traceback" not in err
    assert "<byte string>" not in err

    params.write_text("- just\n- a list\n")
    with pytest.raises(InputError, match="must be a YAML mapping"):
        load_params(params)


def test_ingest_in_a_workspace_never_prepared_says_to_prepare_and_exits_2(workspace, capsys):
    from cli.common import require_data_for_requests

    folders = RequestFolders.create(workspace)
    submit_request(folders, DeletionRequestModel(kind="client", scenario="wine-vfl", client=0))
    (folders.inbox / "broken.json").write_text("{")
    require_data_for_requests(workspace, SCENARIO, "ingest")  # nothing of digits-hfl waits: no data needed
    for path in folders.inbox.iterdir():
        path.unlink()
    submit_request(folders, DeletionRequestModel(kind="sample", scenario=SCENARIO, sample_ids=["digits-00001"]))
    for command in ("ingest", "process"):
        assert run(workspace, command, "--scenario", SCENARIO) == InputError.exit_code, command
        err = capsys.readouterr().err
        assert "never prepared" in err and "manifest.json" in err and "Traceback" not in err
        assert f"fedunlearn --root {workspace} prepare --scenario {SCENARIO}` first" in err
        assert f"{command} --scenario {SCENARIO}` again" in err
    with pytest.raises(FileNotFoundError, match="never prepared"):  # still what callers catch
        read_manifest(SCENARIO, workspace)
    assert len(list(RequestFolders(workspace).inbox.iterdir())) == 1  # the request waits


def test_a_model_step_failing_after_the_deletion_says_the_data_is_changed_and_how_to_resume():
    from stores.registry import ModelArtifactMissing

    entry = LedgerEntry(request_id="r1", batch_id="b1", scenario=SCENARIO, kind="sample", sample_ids=["x"])
    record = BatchRecord(batch_id="b1", scenario=SCENARIO, dataset="digits", status=BatchStatus.COMPLETE,
                         requests=[entry], completed_at=datetime.now(timezone.utc),
                         data_versions={SCENARIO: VersionChange(before="v-before", after="v-after")})
    missing = ModelArtifactMissing("digits-hfl v3: its weights cannot be read. Restore the artifact, or register a "
                                   "new model with `fedunlearn retrain --scenario digits-hfl`")
    raised = raised_in_stage(record, "unlearn and register", missing, StateDamaged)
    message = str(raised)
    assert raised.exit_code == 4 and "failed at unlearn and register" in message and "Restore the artifact" in message
    assert "ARE applied to the data" in message and "v-before -> v-after" in message
    assert f"`fedunlearn process --scenario {SCENARIO}` resumes it" in message

    # Before the ledger append nothing was applied: nothing said
    formed = record.model_copy(update={"status": BatchStatus.FORMED})
    assert "applied to the data" not in str(raised_in_stage(formed, "ingest", missing, StateDamaged))


def raised_in_stage(record: BatchRecord, step: str, error: Exception, expected: type[Exception]) -> Exception:
    """What ``error``, raised inside the batch step ``step``, comes out of ``flows.process.stage`` as."""
    from flows.process import stage

    with pytest.raises(expected) as raised:
        with stage(record, step):
            raise error
    return raised.value


def test_a_store_s_full_disk_during_a_batch_names_the_command_to_run_again():
    # arrange: what a DVC step reports on a full disk (stores.workspace), generic about the command
    record = BatchRecord(batch_id="b1", scenario=SCENARIO, dataset="digits", status=BatchStatus.FORMED, requests=[])
    full = NoSpace("no space left on device (/ws: 0 MiB free) while running `dvc commit`; free space on that "
                   "filesystem, then run the same command again: the batch resumes where it stopped")

    # act
    raised = raised_in_stage(record, "ingest", full, NoSpace)

    # assert
    message = str(raised)
    assert raised.exit_code == 7 and "b1 (digits-hfl) failed at ingest: no space left on device (/ws" in message
    assert message.endswith(f"; once space is freed, run `fedunlearn process --scenario {SCENARIO}` again"), message


@pytest.mark.parametrize("rows, column, lines, problem", [
    ("7,30,yes\n,41,no\n11,22,yes\n", "pid", "3", "no ID"),
    ("7,30,yes\n9,41,\n11,22,yes\n", "label", "3", "no label"),
    ("7,30,yes\n9,,no\n11,inf,yes\n", "age", "3, 4", "no finite number"),
    ("7,30,yes\n9,41,no\n7,22,yes\n9,1,no\n", "pid", "2, 4", "repeats IDs"),
    ("7,30,yes\n9,old,no\n", "age", "3", "not numeric"),
])
def test_a_csv_with_a_gap_or_a_repeated_id_is_refused_naming_the_lines_and_column(tmp_path, rows, column, lines,
                                                                                  problem):
    path = tmp_path / "people.csv"
    path.write_text("pid,age,label\n" + rows)
    with pytest.raises(InputError) as raised:
        load_csv("people", path, id_column="pid")
    message = str(raised.value)
    assert str(path) in message and repr(column) in message and problem in message, message
    assert re.search(rf"lines?(\(s\))? {lines}\b", message) and "fedunlearn prepare" in message, message


def test_a_bad_csv_stops_prepare_with_exit_2(workspace, tmp_path, capsys):
    csv = tmp_path / "people.csv"
    csv.write_text("pid,age,label\n7,30,yes\n,41,no\n")
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["datasets"] = {"people": {"source": "csv", "path": str(csv), "id_column": "pid"}}
    params["prepare"] = [*params["prepare"], "people"]
    params["scenarios"]["people-hfl"] = {"dataset": "people", "setting": "hfl", "model": "mlp"}
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run(workspace, "prepare", "--scenario", "people-hfl") == InputError.exit_code
    err = capsys.readouterr().err
    assert str(csv) in err and "'pid'" in err and "line(s) 3" in err and "Traceback" not in err
    with pytest.raises(InputError):
        load_source("people", params["datasets"]["people"])


def one_error_line(err: str) -> str:
    """What the command printed on stderr: exactly one line, an ``error:`` one, no traceback."""
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_a_lost_postgresql_says_to_start_it_first_then_rerun(tmp_path, capsys):
    import json
    import subprocess
    import sys

    from cli import report_error
    from fedunlearn.errors import BatchFailed

    cluster = tmp_path / ".postgres"
    (cluster / "data").mkdir(parents=True)
    (cluster / "workspace.json").write_text(json.dumps({"server": "local"}))
    (cluster / "data/PG_VERSION").write_text("16\n")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # postmaster.pid of a server killed with SIGKILL: it names a process that is gone
    (cluster / "data/postmaster.pid").write_text(f"{gone.pid}\n{cluster}/data\n1700000000\n54321\n")
    failed = BatchFailed("batch-b1 (digits-hfl) failed at unlearn and register: (psycopg2.OperationalError) "
                         "connection to server at 127.0.0.1 failed: Connection refused; re-run `fedunlearn process "
                         "--scenario digits-hfl` to resume")

    assert report_error(failed, "`fedunlearn process --scenario digits-hfl`", tmp_path) == 1

    err = one_error_line(capsys.readouterr().err)
    assert f"the workspace's PostgreSQL ({cluster}) stopped" in err and "batch-b1 (digits-hfl) failed at" in err
    assert f"Start it with `fedunlearn --root {tmp_path} db start`, then run `fedunlearn process --scenario " \
           "digits-hfl` again" in err
    # A registry read failing on the stopped database is no damaged state; bad input keeps its own message.
    unreadable = StateDamaged("digits-hfl v3: its weights cannot be read")
    assert report_error(unreadable, "`fedunlearn process`", tmp_path) == 1
    assert "db start" in one_error_line(capsys.readouterr().err)
    assert report_error(InputError("no such scenario"), "`fedunlearn process`", tmp_path) == 2
    assert capsys.readouterr().err == "error: no such scenario\n"


def test_a_lost_prefect_server_ends_in_one_error_line_naming_the_rerun(tmp_path, capsys):
    import io
    import logging
    import subprocess
    import sys

    import httpx

    from cli import report_error
    from cli.common import KnownErrorTracebacks
    from runtime.local_server import stop

    server = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    server.wait()
    stop(server, tmp_path / "server.log")  # the command's own server, found dead as the command ends
    try:
        try:
            raise httpx.ConnectError("All connection attempts failed")
        except httpx.ConnectError as cut:
            raise RuntimeError("the flow run's state could not be set") from cut
    except RuntimeError as err:
        lost = err

    assert report_error(lost, "`fedunlearn process --scenario digits-hfl`", tmp_path) == 1

    err = one_error_line(capsys.readouterr().err)
    assert "the command's own Prefect server stopped while the command ran" in err and "server.log" in err
    assert "ConnectError: All connection attempts failed" in err
    assert "run `fedunlearn process --scenario digits-hfl` again: a deletion batch resumes" in err

    # What Prefect logs on the way (task run, flow run, workers) keeps its line but not its traceback.
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(KnownErrorTracebacks())
    logger = logging.getLogger("test-lost-server")
    logger.addHandler(handler)
    try:
        logger.error("Task run failed", exc_info=(type(lost), lost, lost.__traceback__))
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == ("Task run failed (ConnectError: All connection attempts failed)\n")


def test_the_run_that_loses_the_batch_lock_prints_no_traceback(workspace, prefect_server, monkeypatch, capfd):
    """Prefect logs the flow's exception with its traceback; the lock's loser (status 3) says it in its
    one error line, and the log line it keeps names it, with no traceback (issue 51). The log is read
    through a handler of the test's own: the filter goes on every handler, and Prefect's console
    handler may still write to a stream an earlier test closed."""
    import io
    import logging

    import flows.ingest
    from fedunlearn.requests.folders import batch_lock

    monkeypatch.setattr(flows.ingest, "LOCK_TIMEOUT_S", 0.2)
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    logging.getLogger("prefect.flow_runs").addHandler(handler)
    try:
        with batch_lock(RequestFolders.create(workspace)):  # the other batch
            status = main(["--root", str(workspace), "ingest", "--scenario", "digits-hfl"])
    finally:
        logging.getLogger("prefect.flow_runs").removeHandler(handler)
    errors = [line for line in capfd.readouterr().err.splitlines() if line.startswith("error: ")]
    assert status == 3 and len(errors) == 1 and errors[0].startswith("error: another deletion batch is running")
    assert "BatchInProgress: another deletion batch is running" in logged.getvalue(), logged.getvalue()
    assert "Traceback" not in logged.getvalue(), logged.getvalue()


def test_benchmark_out_naming_a_file_is_refused_before_any_work(workspace, tmp_path, capsys):
    (tmp_path / "results").write_text("")
    status = main(["--root", str(workspace), "benchmark", "--scenario", "digits-hfl", "--request", "class:0",
                   "--out", str(tmp_path / "results")])
    err = one_error_line(capsys.readouterr().err)
    assert status == 2 and "is a file: give a directory" in err and (tmp_path / "results").read_text() == ""
