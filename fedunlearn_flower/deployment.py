"""Flower's deployment engine on this machine: a SuperLink and one SuperNode process per client on
127.0.0.1 (``LocalDeployment``), or an existing SuperLink given by the address of its Control API.

A job is submitted with ``flwr run --stream``, which returns when the run ends. While it runs,
the local deployment watches its SuperNodes: one that exits mid-run ends the job at once with
``NodeLost`` naming it (Flower itself would wait for the node's missed heartbeats). ``stop``
always runs — on success, on error, on KeyboardInterrupt — and ends every process the deployment
started and every process those started (the SuperExec, the ServerApp, the ClientApps), so no
Flower process outlives a job. ``stop`` cannot run in a process killed with SIGKILL: the SuperLink
and each SuperNode are therefore started under a ``fedunlearn.lifeline`` guard, which ends the
process and all it started once the process that started the deployment is gone, and ``flwr run``
under the lifeline.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from fedunlearn import lifeline
from fedunlearn_flower.errors import FlowerRunFailed, NodeLost, NodeNeverConnected
from fedunlearn_flower.partition import Scenario
from fedunlearn_flower.results import FlowerResult, read_result
from fedunlearn_flower.server_app import Job

HOST = "127.0.0.1"
# The fault tests' hook, as ``fedunlearn.faults``'s failpoints are the batch's: ``kill-supernode:<i>``
# makes the local deployment SIGKILL SuperNode i mid-round (``NodeKiller``). Unset in production.
FAULT_VARIABLE = "FEDUNLEARN_FLOWER_FAULT"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
CONNECTION = "fedunlearn"  # the SuperLink connection's name in the deployment's Flower configuration
APP_TOML = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "fedunlearn-flower"
version = "1.0.0"
description = "fedunlearn's Flower app: FedAvg training and unlearning rounds"
dependencies = []

[tool.flwr.app]
publisher = "fedunlearn"

[tool.flwr.app.components]
serverapp = "fedunlearn_flower.server_app:app"
clientapp = "fedunlearn_flower.client_app:app"

[tool.flwr.app.config]
job = ""
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@dataclass
class FlowerProcess:
    """One process the deployment started: its role, the address it serves, its log."""

    role: str
    address: str
    process: subprocess.Popen  # the lifeline's guard, whose one child runs ``command``
    log: Path
    command: list[str] = field(default_factory=list)
    clientappio: str = ""  # a SuperNode's ClientAppIo address (its ClientApps dial it)
    seen: set[int] = field(default_factory=set)  # PIDs of its descendants, collected while it runs

    def describe(self) -> str:
        return f"{self.role} (pid {self.process.pid}, {self.address})"

    def command_pid(self) -> int | None:
        """The PID of the Flower program itself, None once it is gone: below the lifeline's guard,
        the guard's child that runs the program, the earliest created (an orphan the guard adopted
        was started by the program, so later)."""
        program = Path(self.command[0]).name
        try:
            guard = psutil.Process(self.process.pid)
            if not sys.platform.startswith("linux"):
                return guard.pid  # started without the guard
            # A console script runs as `python <script> ...`: its name is among the first arguments.
            runs = [c for c in guard.children() if any(Path(a).name == program for a in c.cmdline()[:2])]
            return min(runs, key=lambda c: (c.create_time(), c.pid)).pid if runs else None
        except psutil.Error:
            return None

    def log_tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "\n".join(_ANSI.sub("", text).splitlines()[-lines:])  # Flower colours its log levels


class FlowerHome:
    """A Flower configuration folder (FLWR_HOME) whose default SuperLink connection is ``control``."""

    def __init__(self, folder: Path, control: str):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n'
                                            f'[superlink.{CONNECTION}]\naddress = "{control}"\ninsecure = true\n')
        self.app_dir = folder / "app"
        self.app_dir.mkdir(exist_ok=True)
        (self.app_dir / "pyproject.toml").write_text(APP_TOML)

    def env(self) -> dict[str, str]:
        # One intra-op thread per Flower process: several share the cores, and the ClientApps'
        # results match the in-process engine's bit for bit only with the same reduction order.
        # Flower starts its helpers (flower-superexec, flwr-serverapp, flwr-clientapp) by name.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return {**os.environ, "PATH": path, "FLWR_HOME": str(self.folder), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"}


def fault_target(value: str | None) -> int | None:
    """The partition whose SuperNode ``FEDUNLEARN_FLOWER_FAULT`` (``value``) says to kill, or None."""
    if not value:
        return None
    action, _, partition = value.partition(":")
    if action != "kill-supernode" or not partition.isdigit():
        raise FlowerRunFailed(f"{FAULT_VARIABLE}={value!r}: expected kill-supernode:<partition ID>")
    return int(partition)


class NodeKiller:
    """SIGKILLs SuperNode ``partition`` as its second ClientApp starts: the first message after the
    partition query (a training round, PUF's unlearning round on a target), while it computes — a
    crash or the OOM killer, as the server sees it. Called from ``LocalDeployment.watch``."""

    def __init__(self, partition: int):
        self.partition = partition
        self.clientapps: set[int] = set()
        self.killed: int | None = None  # the SuperNode's pid, once killed

    def __call__(self, nodes: dict[int, "FlowerProcess"]) -> None:
        node = nodes.get(self.partition)
        if node is None or self.killed is not None or node.process.poll() is not None:
            return
        for pid in _descendants(node.process.pid):
            try:
                if any("flwr-clientapp" in arg for arg in psutil.Process(pid).cmdline()):
                    self.clientapps.add(pid)
            except psutil.Error:
                continue
        supernode = node.command_pid()
        if len(self.clientapps) >= 2 and supernode is not None:
            os.kill(supernode, signal.SIGKILL)  # the SuperNode itself: its guard then ends its ClientApps
            self.killed = supernode


class LocalDeployment:
    """A SuperLink and ``num_nodes`` SuperNodes (partition IDs 0..n−1) on 127.0.0.1, as a context
    manager: ``start`` on entry, ``stop`` on exit whatever happened. ``superlinks`` overrides the
    Fleet API address a node dials (a node told a wrong one never connects: the fault tests)."""

    def __init__(self, num_nodes: int, folder: str | Path, *, start_timeout: float = 60.0,
                 superlinks: dict[int, str] | None = None):
        self.num_nodes = num_nodes
        self.folder = Path(folder)
        self.start_timeout = start_timeout
        self.superlinks = superlinks or {}
        self.fleet, self.appio, self.control = (f"{HOST}:{free_port()}" for _ in range(3))
        self.home = FlowerHome(self.folder / "flwr-home", self.control)
        self.superlink: FlowerProcess | None = None
        self.nodes: dict[int, FlowerProcess] = {}
        target = fault_target(os.environ.get(FAULT_VARIABLE))
        self.fault = NodeKiller(target) if target is not None else None

    def __enter__(self) -> "LocalDeployment":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "LocalDeployment":
        self.superlink = self._spawn("SuperLink", self.control, [
            _bin("flower-superlink"), "--insecure", "--fleet-api-address", self.fleet,
            "--serverappio-api-address", self.appio, "--control-api-address", self.control,
            "--disable-runtime-dependency-installation"])
        _wait_for_port(self.superlink, self.fleet, self.start_timeout)
        _wait_for_port(self.superlink, self.control, self.start_timeout)
        for i in range(self.num_nodes):
            self.start_node(i)
        return self

    def start_node(self, partition: int) -> FlowerProcess:
        """SuperNode ``partition``: it dials the SuperLink and serves its ClientApps on its own port."""
        clientappio = f"{HOST}:{free_port()}"
        superlink = self.superlinks.get(partition, self.fleet)
        node = self._spawn(f"SuperNode {partition}", f"ClientAppIo {clientappio}, dials SuperLink {superlink}", [
            _bin("flower-supernode"), "--insecure", "--superlink", superlink, "--clientappio-api-address",
            clientappio, "--node-config", f"partition-id={partition} num-partitions={self.num_nodes}"])
        node.clientappio = clientappio
        self.nodes[partition] = node
        return node

    def _spawn(self, role: str, address: str, command: list[str]) -> FlowerProcess:
        log = self.folder / "logs" / (role.lower().replace(" ", "-") + ".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(lifeline.guarded(command), stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=self.home.env(), cwd=self.folder)
        return FlowerProcess(role, address, process, log, command)

    def processes(self) -> list[FlowerProcess]:
        return [p for p in [self.superlink, *self.nodes.values()] if p is not None]

    def watch(self) -> None:
        """Note every descendant of the deployment's processes (to end them all at ``stop``, even
        those whose parent died first), and raise ``NodeLost`` for a SuperNode that exited."""
        for proc in self.processes():
            proc.seen.update(_descendants(proc.process.pid))
        if self.fault is not None:
            self.fault(self.nodes)
        for partition, node in self.nodes.items():
            if node.process.poll() is not None:
                raise NodeLost(f"{node.describe()} exited with status {node.process.returncode} mid-run: "
                               f"client {partition} is gone and the run was stopped, nothing was produced from "
                               f"it; restart the node and run the same command again. Its log ends:\n"
                               f"{node.log_tail()}")
        if self.superlink is not None and self.superlink.process.poll() is not None:
            raise FlowerRunFailed(f"{self.superlink.describe()} exited mid-run:\n{self.superlink.log_tail()}")

    def addresses(self) -> set[str]:
        """The addresses this deployment serves: every Flower process it led to names one of them
        on its command line (a ClientApp its SuperNode's ClientAppIo, the ServerApp the ServerAppIo)."""
        return {self.fleet, self.appio, self.control, *(n.clientappio for n in self.nodes.values())}

    def stop(self, grace: float = 1.0) -> None:
        """End every process started here, every descendant seen, and every process serving or
        dialling one of the deployment's addresses (a ClientApp whose SuperNode was killed has no
        parent left to find it by): SIGTERM, then SIGKILL after ``grace`` seconds — their state is
        in memory only, so a SuperLink's graceful shutdown saves nothing worth the wait."""
        procs = self.processes()
        pids = {p.process.pid for p in procs} | {pid for pid, _ in _processes_naming(self.addresses())}
        for proc in procs:
            pids |= proc.seen | set(_descendants(proc.process.pid))
        _end(pids, grace)
        for proc in procs:
            proc.process.wait(timeout=5.0)  # reaped: no zombie left behind

    def alive(self) -> list[str]:
        """Processes of this deployment still running (empty after ``stop``): PID and command line."""
        pids = {p.process.pid for p in self.processes()} | {pid for p in self.processes() for pid in p.seen}
        found = dict(_processes_naming(self.addresses()))
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found[pid] = " ".join(proc.cmdline())
            except psutil.NoSuchProcess:
                continue
        return [f"{pid} {cmdline}" for pid, cmdline in sorted(found.items())]


def _processes_naming(addresses: set[str]) -> list[tuple[int, str]]:
    """Live processes with one of ``addresses`` as a command-line argument, and their command lines."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        args = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(arg in addresses for arg in args):
            found.append((proc.info["pid"], " ".join(args)))
    return found


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _end(pids: set[int], grace: float) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, survivors = psutil.wait_procs(procs, timeout=grace)
    for proc in survivors:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(survivors, timeout=grace)


def _wait_for_port(owner: FlowerProcess, address: str, timeout: float) -> None:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if owner.process.poll() is not None:
            raise FlowerRunFailed(f"{owner.describe()} exited at start:\n{owner.log_tail()}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.1)
    raise FlowerRunFailed(f"{owner.describe()} did not open {address} within {timeout:g} s:\n{owner.log_tail()}")


def submit(job: Job, home: FlowerHome, *, timeout: float = 600.0, watch=lambda: None) -> FlowerResult:
    """Run ``job`` on the SuperLink of ``home`` by ``flwr run`` and wait for its status, calling
    ``watch`` (the local deployment's health check) while it runs."""
    path, start = job.write(), time.perf_counter()
    status = Path(job.out_dir) / "status.json"
    log = Path(job.out_dir) / "flwr-run.log"
    with log.open("ab") as out:
        command = [_bin("flwr"), "run", str(home.app_dir), CONNECTION, "--run-config", f'job="{path}"', "--stream"]
        run = subprocess.Popen(lifeline.command(command), stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=home.env(), cwd=home.folder)
    try:
        deadline = time.monotonic() + timeout
        while not status.is_file():
            watch()
            if run.poll() is not None and not status.is_file():
                raise FlowerRunFailed(f"`flwr run` ended (status {run.returncode}) without the job's status:\n"
                                      + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
            if time.monotonic() > deadline:
                raise FlowerRunFailed(f"the Flower run of {job.scenario} did not end within {timeout:g} s")
            time.sleep(0.2)
    finally:
        _end({run.pid, *_descendants(run.pid)}, grace=2.0)
    return read_result(job, time.perf_counter() - start)


def run_deployed(job: Job, *, superlink: str | None = None, timeout: float = 600.0,
                 superlinks: dict[int, str] | None = None,
                 on_start: Callable[[LocalDeployment], None] | None = None) -> FlowerResult:
    """Run ``job`` on a local deployment started and stopped here, or (``superlink``: the address of
    an existing SuperLink's Control API, whose SuperNodes hold the clients) on that federation.
    ``on_start`` sees the local deployment once it runs (the tests inspect and injure it)."""
    start = time.perf_counter()
    if superlink is not None:
        return submit(job, FlowerHome(Path(job.out_dir) / "flwr-home", superlink), timeout=timeout)
    clients = Scenario.load(job.root, job.scenario).num_clients
    with LocalDeployment(clients, Path(job.out_dir) / "deployment", superlinks=superlinks) as deployment:
        if on_start is not None:
            on_start(deployment)
        try:
            result = submit(job, deployment.home, timeout=timeout, watch=deployment.watch)
        except NodeNeverConnected as err:
            missing = [deployment.nodes[c].describe() for c in err.clients if c in deployment.nodes]
            raise NodeNeverConnected(f"{err}. Not connected: {'; '.join(missing)}", err.clients) from err
    result.seconds = time.perf_counter() - start
    return result
