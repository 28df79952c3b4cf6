"""Shared by the fault-injection and concurrency tests (issue #10): one Prefect server for a test
module, `fedunlearn` CLI processes driven against one trained digits-hfl workspace (a copy of the
session's), and the exactly-once invariants read back from the real stores (ledger, batch journal,
request folders, MLflow registry, receipts).

Every CLI run is a separate process in its own session (process group), with
its own PREFECT_HOME, talking to the module's server. Without PREFECT_API_URL each run starts a
Prefect server of its own (``runtime.local_server``), a child process that costs seconds to start
and that must die with a SIGKILLed run. The process group shows whether a killed run left any
child behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock

from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, LedgerEntry
from fedunlearn.faults import FAILPOINT_VARIABLE
from fedunlearn.receipts import RECEIPTS_DIR, read_receipt
from fedunlearn.requests.batch import BatchRecord, BatchStatus, load_records
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import submit_request
from fedunlearn.requests.model import RequestKind, build_request
from workspaces import PrefectServer, copy_workspace

SCENARIO = "digits-hfl"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 300
# Metrics that a re-run recomputes: the receipt's must equal those of the registered version's run.
COMPARED_METRICS = ("test_acc", "retain_acc", "forget_acc", "mia_auc")


def base_environment(prefect_home: Path) -> dict[str, str]:
    """What every child process gets: no telemetry, its own Prefect home, one intra-op thread
    (a second one only spins on this shared 2-core machine), none of the pytest process's MLflow
    setting (the CLI finds the workspace's registry itself, as it does for users)."""
    env = {key: value for key, value in os.environ.items()
           if key not in (FAILPOINT_VARIABLE, "MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    prefect_home.mkdir(parents=True, exist_ok=True)
    return {**env, "PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "GX_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def group_members(pgid: int) -> list[str]:
    """The command lines of the live processes in process group ``pgid`` (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
                members.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return members


def wait_until_group_gone(pgid: int, timeout: float = 10.0) -> list[str]:
    """Poll until nothing of the group lives (a child signalled by the kernel needs a moment to
    die); returns what is still there at the timeout."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return group_members(pgid) if group_alive(pgid) else []


@dataclass
class Finished:
    """A CLI run that ended: its exit status (-9: SIGKILL), what it printed, how long it took."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        return (f"`fedunlearn {' '.join(self.args)}` exited {self.returncode} after {self.seconds:.1f} s\n"
                f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}")


@dataclass
class Running:
    args: tuple[str, ...]
    process: subprocess.Popen
    out: Path
    err: Path
    started: float = field(default_factory=time.monotonic)

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> Finished:
        """Wait for the run; then nothing it started may be left in its process group (its own
        Prefect server included: a killed run's dies with it, within seconds)."""
        try:
            self.process.wait(timeout)
        finally:
            leftover = wait_until_group_gone(self.process.pid)
            if leftover:  # the run itself (out of time) or what it left behind: ours to kill, then fail
                with suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        finished = Finished(self.args, self.process.returncode, self.out.read_text(), self.err.read_text(),
                            time.monotonic() - self.started)
        assert not leftover, f"processes of the run outlived it: {leftover}\n{finished.describe()}"
        return finished


@dataclass
class Cli:
    """`fedunlearn --root <workspace>` as separate processes against one Prefect server."""

    workspace: Path
    api_url: str
    scratch: Path
    numbers: count = field(default_factory=count)
    started: list[Running] = field(default_factory=list)

    def start(self, *args: str, failpoint: str | None = None, own_server: bool = False,
              extra_env: dict[str, str] | None = None) -> Running:
        """``own_server``: no PREFECT_API_URL, so the run starts its own Prefect server, as a user's
        `fedunlearn process` does by default. ``extra_env``: e.g. an injected clock."""
        n = next(self.numbers)
        env = {**base_environment(self.scratch / f"prefect-home-{n}"), **(extra_env or {})}
        if not own_server:
            env["PREFECT_API_URL"] = self.api_url
        if failpoint:
            env[FAILPOINT_VARIABLE] = failpoint
        out, err = self.scratch / f"run-{n}.out", self.scratch / f"run-{n}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen([str(BIN / "fedunlearn"), "--root", str(self.workspace), *args], env=env,
                                       stdout=stdout, stderr=stderr, start_new_session=True)
        self.started.append(Running(args, process, out, err))
        return self.started[-1]

    def kill_leftovers(self) -> None:
        """After a failed test: no run of ours outlives it. A live leader keeps its group ID ours to kill."""
        for run in self.started:
            if run.process.poll() is None:
                os.killpg(run.process.pid, signal.SIGKILL)
                run.process.wait()

    def run(self, *args: str, failpoint: str | None = None, own_server: bool = False,
            extra_env: dict[str, str] | None = None) -> Finished:
        return self.start(*args, failpoint=failpoint, own_server=own_server, extra_env=extra_env).wait()

    def process(self, failpoint: str | None = None, own_server: bool = False) -> Finished:
        return self.run("process", "--scenario", SCENARIO, failpoint=failpoint, own_server=own_server)


class SampleIds:
    """Training sample IDs of the trained workspace, handed out once each: no two requests of a
    test name the same sample, so every request is valid and deletes something."""

    def __init__(self, workspace: Path):
        partition = load_horizontal(SCENARIO, workspace)
        # Round-robin over the clients: every batch touches several of them.
        per_client = [client.sample_ids.tolist() for client in partition.clients]
        self.unused = [ids[i] for i in range(max(map(len, per_client))) for ids in per_client if i < len(ids)]

    def take(self, n: int) -> list[str]:
        taken, self.unused = self.unused[:n], self.unused[n:]
        assert len(taken) == n, "the partition has run out of sample IDs for new requests"
        return taken


def submit(workspace: Path, sample_ids: list[str]) -> str:
    """A sample request written into the inbox the way `fedunlearn request samples` writes it."""
    request = build_request({"kind": RequestKind.SAMPLE, "scenario": SCENARIO, "sample_ids": sample_ids})
    submit_request(RequestFolders.create(workspace), request)
    return request.request_id


def registry(workspace: Path):
    from mlflow import MlflowClient

    from stores.registry import tracking_uri

    return MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))


def alias_version(workspace: Path, alias: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return str(registry(workspace).get_model_version_by_alias(SCENARIO, alias).version)
    except MlflowException:
        return None


@dataclass
class Stores:
    """What the stores hold about requests and batches, read fresh from disk and the registry."""

    ledger: list[LedgerEntry]
    records: list[BatchRecord]             # the batch journal, oldest first
    roles: Counter                         # registered versions per role tag (None: a version without one)
    unlearned: dict[str, dict[int, str]]   # batch_id -> attempt -> the version registered for it
    receipts: list[str]                    # batch IDs with a receipt file
    inbox: list[str]
    processed: list[str]
    quarantined: list[str]

    @classmethod
    def read(cls, workspace: Path) -> "Stores":
        folders = RequestFolders.create(workspace)
        versions = registry(workspace).search_model_versions(f"name='{SCENARIO}'")
        unlearned: dict[str, dict[int, str]] = {}
        for version in versions:
            if "attempt" in version.tags:
                attempts = unlearned.setdefault(version.tags["batch_id"], {})
                assert int(version.tags["attempt"]) not in attempts, f"attempt registered twice: {version.tags}"
                attempts[int(version.tags["attempt"])] = str(version.version)
        return cls(ledger=Ledger(workspace / LEDGER_PATH).entries(), records=load_records(folders),
                   roles=Counter(version.tags.get("role") for version in versions), unlearned=unlearned,
                   receipts=sorted(p.stem for p in (workspace / RECEIPTS_DIR).glob("*.json")),
                   inbox=sorted(p.name for p in folders.inbox.iterdir()),
                   processed=sorted(p.name for p in folders.processed.iterdir()),
                   quarantined=sorted(p.name for p in folders.quarantine.iterdir()))


@dataclass
class Tally:
    """Submitted requests against the ledger and the inbox: what the reliability figures report."""

    lost: list[str]           # neither in the ledger nor waiting in the inbox
    applied_twice: list[str]  # in the ledger more than once


def tally(stores: Stores, submitted: list[str]) -> Tally:
    in_ledger = Counter(entry.request_id for entry in stores.ledger)
    waiting = {name.removesuffix(".json") for name in stores.inbox}
    return Tally(lost=[rid for rid in submitted if rid not in in_ledger and rid not in waiting],
                 applied_twice=[rid for rid in submitted if in_ledger[rid] > 1])


def check_exactly_once(workspace: Path, submitted: list[str], may_wait: frozenset[str] = frozenset()) -> None:
    """Every invariant the issue names, over all batches so far: ``submitted`` are all requests
    ever made in the workspace; those in ``may_wait`` (ones that raced the last run) may still
    wait in the inbox, every other one must be applied."""
    stores = Stores.read(workspace)
    found = tally(stores, submitted)
    assert not found.lost and not found.applied_twice, found
    in_ledger = {entry.request_id for entry in stores.ledger}
    waiting = {name.removesuffix(".json") for name in stores.inbox}
    assert in_ledger <= set(submitted), "the ledger holds requests nobody submitted"
    assert waiting <= may_wait, f"requests left in the inbox: {sorted(waiting - may_wait)}"

    # Each request file moved to processed/ exactly once, after its batch; no sample deleted twice.
    assert stores.processed == sorted(f"{rid}.json" for rid in in_ledger), stores.processed
    assert not stores.quarantined, f"valid requests were quarantined: {stores.quarantined}"
    deleted = [i for entry in stores.ledger for i in entry.sample_ids]
    assert len(deleted) == len(set(deleted)), "a sample ID is deleted by two ledger entries"

    # One complete journal and one receipt per batch; each attempt of a batch registered once, the
    # receipt listing exactly those, in order; no version but the original, the attempts and the
    # retrained references (a version without its role would be a half-finished registration).
    batches = [record.batch_id for record in stores.records]
    assert all(record.status is BatchStatus.COMPLETE for record in stores.records), stores.records
    assert {entry.batch_id for entry in stores.ledger} == set(batches)
    assert stores.receipts == sorted(batches), (stores.receipts, batches)
    assert set(stores.roles) <= {"original", "unlearned", "retrained"} and stores.roles["original"] == 1, stores.roles

    client = registry(workspace)
    current = None  # a freshly trained workspace has no alias `current`; every batch moves it
    for record in stores.records:
        receipt = read_receipt(workspace, record.batch_id)
        assert receipt.request_ids == [entry.request_id for entry in record.requests]
        assert {a.attempt: a.version.version for a in receipt.attempts} == stores.unlearned[record.batch_id], \
            (receipt.attempts, stores.unlearned[record.batch_id])
        chosen = client.get_model_version(SCENARIO, receipt.models["unlearned"].version)
        assert receipt.attempts[-1].version.version == str(chosen.version) and receipt.promoted
        assert chosen.tags["data_version"] == receipt.data_version_after == record.data_version_after
        # The receipt's metrics, which the gates judged, are those of the registered weights, even
        # where a re-run recomputed the unlearning after the version had been registered.
        logged = client.get_run(chosen.run_id).data.metrics
        assert {k: logged[k] for k in COMPARED_METRICS} == \
            {k: receipt.metrics["unlearned"][k] for k in COMPARED_METRICS}, (record.batch_id, logged, receipt.metrics)
        for ref in receipt.models.values():
            assert ref is None or client.get_model_version(SCENARIO, ref.version).run_id == ref.run_id
        current = str(chosen.version)
        assert receipt.models["current"].version == current, (record.batch_id, receipt.models["current"], current)

    # No orphaned alias: `current` names the version the last receipt promoted, a version of the
    # last batch's data version (never one trained on data a batch deleted).
    assert alias_version(workspace, "current") == current, (alias_version(workspace, "current"), current)
    if stores.records:
        assert client.get_model_version(SCENARIO, current).tags["data_version"] == \
            stores.records[-1].data_version_after
    # The original keeps its alias until it retires: once every batch it learnt is forgotten exactly,
    # its weights go and its aliases with them, its record (a tombstone) stays.
    original = [v for v in client.search_model_versions(f"name='{SCENARIO}'") if v.tags.get("role") == "original"]
    assert alias_version(workspace, "original") is not None or original[0].tags.get("retirement") == "retired", \
        original[0].tags

    # The batch lock is free: a dead holder's lock went with its process.
    lock = FileLock(RequestFolders(workspace).lock, timeout=0)  # raises Timeout while a holder lives
    with lock:
        assert lock.is_locked


@contextmanager
def trained_workspace(scratch: Path, template: Path) -> Iterator[tuple[Cli, SampleIds]]:
    """A copy of ``template`` (a workspace in which digits-hfl was trained, alias `original`: the
    session's ``trained_workspaces``), a Prefect server for it, the CLI and the workspace's unused
    sample IDs; the server stops afterwards."""
    server = PrefectServer(scratch / "prefect-server", services=False, env=base_environment(scratch / "prefect-home"))
    server.launch()
    cli = None
    try:
        workspace = copy_workspace(template, scratch / "workspace")  # while the server starts
        cli = Cli(workspace, server.wait_until_healthy(), scratch)
        yield cli, SampleIds(workspace)
    finally:
        if cli is not None:
            cli.kill_leftovers()
        server.stop()


@contextmanager
def prefect_server(scratch: Path) -> Iterator[str]:
    """A Prefect server (API only) for the harness's CLI runs; its URL. It stops afterwards."""
    server = PrefectServer(scratch / "prefect-server", services=False, env=base_environment(scratch / "prefect-home"))
    server.launch()
    try:
        yield server.wait_until_healthy()
    finally:
        server.stop()


@contextmanager
def workspace_copy(scratch: Path, template: Path, api_url: str) -> Iterator[tuple[Cli, SampleIds]]:
    """A copy of ``template`` of its own, the CLI against the server at ``api_url``, and the copy's
    unused sample IDs; no run of the CLI outlives it."""
    cli = Cli(copy_workspace(template, scratch / "workspace"), api_url, scratch)
    try:
        yield cli, SampleIds(cli.workspace)
    finally:
        cli.kill_leftovers()


def wait_for(condition: Callable[[], bool], runs: list[Running], timeout: float = RUN_TIMEOUT_S) -> None:
    """Poll ``condition`` until it holds; give up when every run has exited or time is up."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline and any(r.process.poll() is None for r in runs), \
            "the runs ended (or time ran out) before the awaited state was reached"
        time.sleep(0.1)
