"""The CLI's own Prefect server, for a command run without ``PREFECT_API_URL``.

With no API URL set, Prefect would start a temporary server of its own, and a SIGKILLed CLI left
it running: re-parented to PID 1, holding a port and the workspace's Prefect database. Instead the
CLI starts Prefect's documented server, `prefect server start`, as a ``fedunlearn.lifeline`` child
(the kernel kills it when the CLI dies, however it dies) and points the command's flows at it
(``PREFECT_API_URL``, for the command's duration). It runs the services Prefect's temporary server
runs (event triggers and actions, the event and task-run recorders) and none of the loops that
only served deployments need (scheduler, late runs, ...). Its database is the Prefect home's
(the workspace's ``.prefect/`` unless ``PREFECT_HOME`` says otherwise); its output goes to
``server.log`` there, not into the command's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

from fedunlearn import lifeline
from fedunlearn.errors import FedunlearnError

START_TIMEOUT_S = 120  # a new Prefect home migrates its database on the first start: slow on a cold, small machine
STOP_GRACE_S = 10
LOG_NAME = "server.log"
# The loops of a full server that act on served deployments' runs; the temporary server does not run them either.
SERVED_ONLY_SERVICES = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR",
                        "CANCELLATION_CLEANUP", "CLEANUP_RECONCILER")


class LocalServerFailed(FedunlearnError):
    """The command's Prefect server exited or did not answer: the message names its log."""


def prefect_executable() -> str:
    beside = Path(sys.executable).parent / "prefect"
    return str(beside) if beside.is_file() else (shutil.which("prefect") or "prefect")


def server_environment(home: Path) -> dict[str, str]:
    """This process's environment and Prefect settings, with the served-only services off."""
    from prefect.settings import get_current_settings

    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True)}
    env.pop("PREFECT_API_URL", None)
    env["PREFECT_HOME"] = str(home)
    env.update({f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in SERVED_ONLY_SERVICES})
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(process: subprocess.Popen, api_url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise LocalServerFailed(f"the command's Prefect server exited with status {process.returncode} before it "
                                    f"answered: see {log}")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise LocalServerFailed(f"the command's Prefect server did not answer within {timeout_s:.0f} s: see "
                                        f"{log}; set PREFECT_API_URL to use a running server instead") from None
            time.sleep(0.2)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def local_prefect_api(timeout_s: float = START_TIMEOUT_S) -> Iterator[str | None]:
    """A Prefect server of this command's, its API URL the current setting, while the block runs;
    nothing (None) when ``PREFECT_API_URL`` already names a server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    if PREFECT_API_URL.value():
        yield None
        return
    home = Path(PREFECT_HOME.value()).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), home / LOG_NAME
    command = [prefect_executable(), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
               "--analytics-off"]
    with open(log, "ab") as out:
        process = subprocess.Popen(lifeline.command(command), env=server_environment(home), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    api_url = f"http://127.0.0.1:{port}/api"
    try:
        wait_until_healthy(process, api_url, log, timeout_s)
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            try:
                yield api_url
            finally:
                flush_clients()
    finally:
        stop(process)


def flush_clients() -> None:
    """Send this process's pending Prefect logs and events while the server still runs; left for
    exit, they would wait on a server that is gone."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    EventsWorker.drain_all(timeout=30)
