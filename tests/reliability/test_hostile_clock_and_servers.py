"""Issue 35, tried as a hostile user would, with real `fedunlearn` processes: the Prefect server a
command started is SIGKILLed mid-batch (one `error:` line naming the fix, no traceback; the re-run
resumes exactly once); a deadline with no UTC form waits in the inbox beside a valid request (the one
quarantined with its reason, the other applied); a batch runs with the clock a day ahead, then the next
batch is killed after its ingest at the real clock (the re-run resumes it; `status` agrees).

Each case runs whole batches and starts Prefect servers: minutes on 2 cores, so only `make
reliability` (``RELIABILITY_FULL=1``) runs this module. `make test` covers the same defects at the
level of the functions (tests/test_progress.py, tests/test_error_messages.py,
tests/test_requests_validation.py, tests/test_local_server.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import suppress
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from batch_harness import (SCENARIO, Stores, alias_version, check_exactly_once, registry, submit,
                           trained_workspace, wait_for)
from fedunlearn.receipts import read_receipt
from fedunlearn.requests.batch import BatchStatus
from fedunlearn.requests.model import CLOCK_VARIABLE
from stores.workspace import data_version
from workspaces import status_row

FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = pytest.mark.skipif(not FULL, reason="whole batches against killed servers: `make reliability`")
IDS_PER_REQUEST = 10


@pytest.fixture(scope="module")
def bench(tmp_path_factory, digits_hfl_template):
    with trained_workspace(tmp_path_factory.mktemp("hostile-clock"), digits_hfl_template) as bench:
        yield bench


@pytest.fixture(scope="module")
def submitted() -> list[str]:
    return []


def prefect_servers(pgid: int) -> list[int]:
    """The PIDs of the `prefect server start` processes (and their uvicorn) in process group ``pgid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if int(fields[2]) == pgid and fields[0] != "Z" and "prefect" in command and "server" in command:
                found.append(int(stat.parent.name))
    return found


def assert_one_error_line(stderr: str, *naming: str) -> str:
    assert "Traceback" not in stderr, stderr[-6000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and sum(line.startswith("error: ") for line in stderr.splitlines()) == 1, \
        stderr[-3000:]
    for text in naming:
        assert text in last, last
    return last


def test_a_killed_prefect_server_ends_in_one_error_line_and_the_rerun_resumes_once(bench, submitted,
                                                                                  reliability_report):
    cli, ids = bench
    request = submit(cli.workspace, ids.take(IDS_PER_REQUEST))
    submitted.append(request)
    run = cli.start("process", "--scenario", SCENARIO, own_server=True)

    def ingested() -> bool:  # the batch's data is deleted: from here on a lost server leaves it owed
        with suppress(Exception):
            return any(r.status is BatchStatus.COMPLETE and request in {e.request_id for e in r.requests}
                       for r in Stores.read(cli.workspace).records)
        return False

    wait_for(ingested, [run])
    servers = prefect_servers(run.process.pid)
    assert servers, "the command's own Prefect server was not found"
    killed_at = time.monotonic()
    for pid in servers:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reliability_report.count("Prefect servers killed mid-batch")
    killed = run.wait()

    assert killed.returncode == 1, killed.describe()
    # The command hears of it at once, not after Prefect's retries (139 s and 30 warning lines, issue 51).
    assert time.monotonic() - killed_at < 30, killed.describe()
    assert_one_error_line(killed.stderr, "Prefect server", "fedunlearn --root", "again")
    resumed = cli.process(own_server=True)
    assert resumed.returncode == 0 and "no pending requests" not in resumed.stdout, resumed.describe()
    reliability_report.count("re-runs")
    check_exactly_once(cli.workspace, submitted)


def test_a_deadline_with_no_utc_form_is_quarantined_and_the_other_request_applied(bench, submitted,
                                                                                 reliability_report):
    cli, ids = bench
    refused = cli.run("request", "samples", "--scenario", SCENARIO, "--ids", *ids.take(2),
                      "--deadline", "9999-12-31T23:59:59-23:59")
    assert refused.returncode == 2, refused.describe()
    assert_one_error_line(refused.stderr, "out of range once converted to UTC")
    inbox = cli.workspace / "data/deletion_requests/inbox"
    (inbox / "req-overflow.json").write_text(json.dumps({"kind": "sample", "scenario": SCENARIO,
                                                         "sample_ids": ids.take(2),
                                                         "deadline": "9999-12-31T23:59:59-23:59"}))
    valid = submit(cli.workspace, ids.take(IDS_PER_REQUEST))

    status = cli.run("status", "--scenario", SCENARIO)
    assert status.returncode == 0 and "req-overflow.json" in status.stdout, status.describe()
    done = cli.process()

    assert done.returncode == 0, done.describe()
    reason = (cli.workspace / "data/deletion_requests/quarantine/req-overflow.json.reason.txt").read_text()
    assert "out of range once converted to UTC" in reason
    assert valid in {e.request_id for e in Stores.read(cli.workspace).ledger}
    (cli.workspace / "data/deletion_requests/quarantine/req-overflow.json").unlink()  # for check_exactly_once
    (cli.workspace / "data/deletion_requests/quarantine/req-overflow.json.reason.txt").unlink()
    submitted.append(valid)
    check_exactly_once(cli.workspace, submitted)
    reliability_report.count("hostile deadlines quarantined")


def test_a_batch_killed_after_ingest_is_resumed_although_the_last_one_was_dated_a_day_ahead(bench,
                                                                                           reliability_report):
    """Last in the module: a batch dated ahead makes the journal's time order differ from the real one,
    which check_exactly_once (which reads the records by time) does not expect."""
    cli, ids = bench
    ahead = {CLOCK_VARIABLE: (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()}
    submit(cli.workspace, ids.take(IDS_PER_REQUEST))
    first = cli.run("process", "--scenario", SCENARIO, extra_env=ahead)
    assert first.returncode == 0, first.describe()
    crashed_request = submit(cli.workspace, ids.take(IDS_PER_REQUEST))
    killed = cli.process(failpoint="during-unlearning")
    assert killed.returncode == -signal.SIGKILL, killed.describe()

    resumed = cli.process()

    assert resumed.returncode == 0 and "no pending requests" not in resumed.stdout, resumed.describe()
    [record] = [r for r in Stores.read(cli.workspace).records if crashed_request in {e.request_id for e in r.requests}]
    assert f"resuming {record.batch_id}, which an earlier run left unfinished" in resumed.stdout + resumed.stderr
    receipt = read_receipt(cli.workspace, record.batch_id)
    assert receipt is not None and record.data_version_after == data_version(cli.workspace, SCENARIO)
    serving = registry(cli.workspace).get_model_version(SCENARIO, alias_version(cli.workspace, "current"))
    assert serving.tags["data_version"] == record.data_version_after == receipt.data_version_after
    status = cli.run("status", "--scenario", SCENARIO)
    assert status.returncode == 0 and "no pending requests" in status.stdout, status.describe()
    assert status_row(status.stdout, crashed_request)
    reliability_report.count("batches resumed behind a clock set ahead")
