"""Fault injection (issue #10): `fedunlearn process` is SIGKILLed at each stage of a deletion batch
(the failpoints of ``fedunlearn.faults``), then run again, then once more. Afterwards the stores
must show the batch finished exactly once: one ledger entry per request (none lost, none twice),
one unlearned model version and one receipt per batch, the alias `current` on an existing version
the receipts account for, the inbox empty, every request file processed once, the lock free.

Each test has a copy of the trained workspace of its own (one Prefect server for the module), so
no case depends on which ran before it. The killed run starts its own Prefect server
(`runtime.local_server`), as a user's does: nothing it started may outlive it. The same holds for runs
killed from outside at random moments. `make test` runs one stage, `make reliability`
(RELIABILITY_FULL=1) all seven stages and eight outside kills.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from batch_harness import (Stores, check_exactly_once, group_members, prefect_server, submit, tally, wait_for,
                           workspace_copy)
from fedunlearn.faults import FAILPOINTS

FULL = os.environ.get("RELIABILITY_FULL") == "1"
# Every stage is killed under `make reliability` only (a CLI process killed and rerun per stage, the
# slowest of make test's former subset). make test covers the same recovery in process: the kill after
# the receipt (tests/test_batch_end.py) and the ledger-side windows (tests/test_ingest_flow.py,
# tests/test_process_flow.py).
STAGES = FAILPOINTS
REQUESTS_PER_BATCH = 2
IDS_PER_REQUEST = 10


@pytest.fixture(scope="module")
def api_url(tmp_path_factory):
    """The module's Prefect server."""
    with prefect_server(tmp_path_factory.mktemp("fault-injection")) as url:
        yield url


@pytest.fixture
def bench(tmp_path, digits_hfl_template, api_url):
    """A copy of the session's trained digits-hfl workspace for this test alone."""
    with workspace_copy(tmp_path, digits_hfl_template, api_url) as bench:
        yield bench


@pytest.fixture
def submitted() -> list[str]:
    """Every request this test submitted to its workspace."""
    return []


def newest_batch_requests(stores: Stores) -> list[str]:
    return sorted(entry.request_id for entry in stores.records[-1].requests) if stores.records else []


def what_the_kill_left(stores: Stores, requests: list[str]) -> dict[str, object]:
    """How far the killed batch got, as the stores record it."""
    batch = stores.records[-1] if newest_batch_requests(stores) == sorted(requests) else None
    return {"journal": batch.status.value if batch else None,
            "ledger": set(requests) <= {entry.request_id for entry in stores.ledger},
            "unlearned version": batch is not None and batch.batch_id in stores.unlearned,
            "receipt": batch is not None and batch.batch_id in stores.receipts}


# Where each failpoint sits, as the stores see it right after the kill: proves the harness killed the
# run at the stage it names, not before or after.
KILL_LEAVES = {
    "after-ingest": {"journal": "formed", "ledger": False, "unlearned version": False, "receipt": False},
    "after-ledger-append": {"journal": "formed", "ledger": True, "unlearned version": False, "receipt": False},
    "during-unlearning": {"journal": "complete", "ledger": True, "unlearned version": False, "receipt": False},
    "after-registration": {"journal": "complete", "ledger": True, "unlearned version": True, "receipt": False},
    "after-alias-move": {"journal": "complete", "ledger": True, "unlearned version": True, "receipt": False},
    "after-receipt": {"journal": "complete", "ledger": True, "unlearned version": True, "receipt": True},
    "after-tree-head": {"journal": "complete", "ledger": True, "unlearned version": True, "receipt": True},
}


@pytest.mark.skipif(not FULL, reason="make reliability only: make test covers the same recovery in process "
                    "(tests/test_batch_end.py, tests/test_ingest_flow.py, tests/test_process_flow.py)")
@pytest.mark.parametrize("stage", STAGES)
def test_a_batch_killed_at_a_stage_is_finished_exactly_once_by_the_next_run(bench, submitted, stage,
                                                                           reliability_report):
    cli, sample_ids = bench
    requests = [submit(cli.workspace, sample_ids.take(IDS_PER_REQUEST)) for _ in range(REQUESTS_PER_BATCH)]
    submitted.extend(requests)
    reliability_report.count("requests submitted", len(requests))

    killed = cli.process(failpoint=stage, own_server=True)  # Running.wait: no process of it outlives it
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    reliability_report.count("faults injected (SIGKILL)")
    assert what_the_kill_left(Stores.read(cli.workspace), requests) == KILL_LEAVES[stage]

    resumed = cli.process()
    assert resumed.returncode == 0, resumed.describe()
    reliability_report.count("re-runs")
    after_resume = Stores.read(cli.workspace)

    again = cli.process()  # nothing left to do: the stores stay exactly as the resumed run left them
    assert again.returncode == 0 and again.stdout.strip().endswith("no pending requests"), again.describe()
    reliability_report.count("re-runs")
    assert Stores.read(cli.workspace) == after_resume

    found = tally(after_resume, requests)
    reliability_report.count("requests lost", len(found.lost))
    reliability_report.count("requests applied twice", len(found.applied_twice))
    check_exactly_once(cli.workspace, submitted)
    assert newest_batch_requests(after_resume) == sorted(requests)  # the killed batch, not a later one, took them


OUTSIDE_KILLS = 8


@pytest.mark.skipif(not FULL, reason="make reliability only (two processes and a server killed, tens of seconds): "
                    "make test checks the lifeline itself in tests/test_lifeline.py")
def test_no_process_outlives_a_cli_killed_from_outside(bench, submitted, reliability_report):
    """`fedunlearn process` and `fedunlearn ingest` SIGKILLed by someone else once their own Prefect
    server runs, after a random further delay: the server dies with them, and the next run finishes
    the batch exactly once."""
    cli, sample_ids = bench
    rng = random.Random(15)
    for kill in range(OUTSIDE_KILLS):
        requests = [submit(cli.workspace, sample_ids.take(IDS_PER_REQUEST))]
        submitted.extend(requests)
        command = ("ingest" if kill % 2 else "process", "--scenario", "digits-hfl")
        run = cli.start(*command, own_server=True)
        wait_for(lambda: any(" server start " in member for member in group_members(run.process.pid)), [run])
        time.sleep(rng.uniform(0.0, 3.0))
        os.killpg(run.process.pid, 0)  # still running: the kill below hits a live run
        os.kill(run.process.pid, signal.SIGKILL)  # the CLI alone, as the OOM killer would
        killed = run.wait()  # asserts that nothing of its process group is left
        assert killed.returncode == -signal.SIGKILL, killed.describe()
        reliability_report.count("outside kills, no process left", 1)
        resumed = cli.process()
        assert resumed.returncode == 0, resumed.describe()
        check_exactly_once(cli.workspace, submitted)


# Damage to two stores at once (issue 26): the ledger's last line (a processed batch's) torn, and that
# batch's record truncated or deleted; or the record deleted under an intact ledger. `make reliability`
# runs all three; `make test` checks the same faults through the CLI in process
# (tests/test_ledger_double_faults.py), the process path's repair and resume in tests/test_store_integrity.py.
DOUBLE_FAULTS = ["truncated record", "deleted record", "record only"]


@pytest.mark.skipif(not FULL, reason="make reliability only: the same double faults are checked in make test by "
                                     "tests/test_ledger_double_faults.py (CLI, in process, seconds instead of minutes)")
@pytest.mark.parametrize("fault", DOUBLE_FAULTS)
def test_a_double_fault_stops_the_next_batch_and_repair_brings_nothing_back(bench, submitted, fault,
                                                                            reliability_report):
    """Make reliability only (5 CLI processes per fault, the slowest test of make test's subset):
    tests/test_ledger_double_faults.py::test_double_faults_through_the_cli_bring_nothing_back covers
    the same three faults through the CLI in make test."""
    from fedunlearn.data.store import load_horizontal
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger

    cli, sample_ids = bench
    requests = [submit(cli.workspace, sample_ids.take(IDS_PER_REQUEST))]
    submitted.extend(requests)
    assert cli.process().returncode == 0
    ledger, lock = cli.workspace / LEDGER_PATH, cli.workspace / "dvc.lock"
    record = cli.workspace / "data/deletion_requests/batches" / f"{Stores.read(cli.workspace).records[-1].batch_id}.json"
    written, deleted = ledger.read_bytes(), Ledger(ledger).entries()[-1].sample_ids
    if fault != "record only":
        ledger.write_bytes(written[:-20])
    if fault == "truncated record":
        record.write_text(record.read_text()[:100])
    else:
        record.unlink()
    reliability_report.count("double faults injected")

    waiting = [submit(cli.workspace, sample_ids.take(IDS_PER_REQUEST))]
    submitted.extend(waiting)
    before = lock.read_bytes()
    stopped = cli.process()
    assert stopped.returncode == 4 and requests[0] in stopped.stderr, stopped.describe()
    assert "fedunlearn ledger repair" in stopped.stderr and lock.read_bytes() == before, stopped.describe()
    repaired = cli.run("ledger", "repair")
    assert repaired.returncode == 0 and repaired.stdout.strip().endswith("intact"), repaired.describe()
    assert ledger.read_bytes() == written  # the entry as it was written, hash chain included

    for _ in range(2):  # the rebuilt record's batch resumes (the inbox waits for it), then the waiting request goes
        resumed = cli.process()
        assert resumed.returncode == 0, resumed.describe()
    check_exactly_once(cli.workspace, submitted)
    partition = {i for client in load_horizontal("digits-hfl", cli.workspace).clients for i in client.sample_ids}
    assert not set(deleted) & partition
    reliability_report.count("requests brought back by a double fault", len(set(deleted) & partition))
