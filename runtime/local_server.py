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

While ``make serve`` serves the workspace, its server is the command's instead (``runtime.served``:
the marker serve leaves in the Prefect home): the command's runs then show in the served UI, and no
second server opens the served one's database. ``PREFECT_API_URL`` set by the user still wins.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator

from fedunlearn import lifeline
from fedunlearn.errors import FedunlearnError, causes

START_TIMEOUT_S = 120  # a new Prefect home migrates its database on the first start: slow on a cold, small machine
STOP_GRACE_S = 10
EXIT_POLL_S = 0.5  # how soon a command hears that its own server is gone
LOG_NAME = "server.log"
PORT_LOCK_NAME = "fedunlearn-prefect-port"
# The loops of a full server that act on served deployments' runs; the temporary server does not run them either.
SERVED_ONLY_SERVICES = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR",
                        "CANCELLATION_CLEANUP", "CLEANUP_RECONCILER")
# The settings that name a Prefect server's database (Prefect's and its older aliases).
DATABASE_SETTINGS = ("PREFECT_SERVER_DATABASE_", "PREFECT_API_DATABASE_")


class LocalServerFailed(FedunlearnError):
    """The command's Prefect server exited or did not answer: the message names its log."""


# The command's own server once it exited before the command stopped it (killed, crashed): its exit
# status and log, which explain the connection errors the command's flows then meet.
_EXITED: list[tuple[int, Path]] = []


def exited_early() -> tuple[int, Path] | None:
    """The exit status and log of this process's own Prefect server if it exited by itself before the
    command stopped it; None otherwise. Read once: the record goes with the command that asked."""
    return _EXITED.pop() if _EXITED else None


def connection_lost(err: BaseException) -> BaseException | None:
    """The error in ``err``'s chain (causes, contexts, exception groups) that says a server stopped
    answering — connection refused, reset or cut off mid-reply — or None."""
    import httpx

    lost = (httpx.NetworkError, httpx.RemoteProtocolError, ConnectionError)
    return next((e for e in causes(err) if isinstance(e, lost)), None)


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


def stop(process: subprocess.Popen, log: Path | None = None) -> None:
    """Stop the server; one that already exited on its own is recorded (``exited_early``)."""
    if process.poll() is not None:
        if log is not None and (process.returncode, log) not in _EXITED:  # once, if ``watch_exit`` saw it first
            _EXITED.append((process.returncode, log))
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def port_choice_lock(timeout_s: float) -> Iterator[None]:
    """This user's lock from choosing a free port until the server listens on it. The probe that finds
    a free port closes it again, and the kernel hands the same port to the next probe, so two commands
    starting at once would otherwise both start a server on it and one would fail."""
    path = Path(tempfile.gettempdir()) / f"{PORT_LOCK_NAME}-{os.getuid()}.lock"
    with open(path, "a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LocalServerFailed(f"another command held {path} for {timeout_s:.0f} s while starting its "
                                            "Prefect server: run the command again, or set PREFECT_API_URL to use "
                                            "a running server") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_listening(start: Callable[[int], subprocess.Popen], ready: Callable[[subprocess.Popen, int], None],
                    timeout_s: float, choose: Callable[[], int] = free_port) -> tuple[int, subprocess.Popen]:
    """A server started on a free port (``start``) and listening there (``ready`` returns), the port
    chosen and taken under ``port_choice_lock``; one that does not get ready is stopped."""
    with port_choice_lock(timeout_s):
        port = choose()
        process = start(port)
        try:
            ready(process, port)
        except BaseException:
            stop(process)
            raise
        return port, process


@contextlib.contextmanager
def local_prefect_api(timeout_s: float = START_TIMEOUT_S,
                      on_exit: Callable[[], None] | None = None) -> Iterator[str | None]:
    """A Prefect server for this command, its API URL the current setting, while the block runs: the
    served workspace's server when ``make serve`` runs (its marker, ``runtime.served``), else one of
    the command's own (``on_exit`` called the moment it exits by itself); nothing (None) when
    ``PREFECT_API_URL`` already names a server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from runtime.served import answers, runs_page, served_api

    if PREFECT_API_URL.value():
        yield None
        return
    home = Path(PREFECT_HOME.value()).expanduser()
    served = served_api(home)
    if served is not None:
        print(f"runs show in the Prefect UI: {runs_page(served)} (the server `make serve` runs for this workspace)",
              file=sys.stderr, flush=True)
        with temporary_settings(updates={PREFECT_API_URL: served}):
            try:
                yield served
            finally:
                if answers(served):  # one that went away takes nothing: the drain would wait and fail
                    flush_clients()
        return
    _EXITED.clear()
    with prefect_server(home, timeout_s, own=True, on_exit=on_exit) as api_url:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield api_url


@contextlib.contextmanager
def served_prefect_api() -> Iterator[str | None]:
    """The served workspace's Prefect server (``make serve``'s marker) as the API URL while the block
    runs, for a command that only reads from Prefect (``status``): it never starts a server of its own.
    None when there is none, or ``PREFECT_API_URL`` already names one."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from runtime.served import served_api

    served = None if PREFECT_API_URL.value() else served_api(Path(PREFECT_HOME.value()).expanduser())
    if served is None:
        yield None
        return
    with temporary_settings(updates={PREFECT_API_URL: served}):
        yield served


def watch_exit(process: subprocess.Popen, log: Path, on_exit: Callable[[], None]) -> threading.Event:
    """A daemon thread that records the server's exit (``exited_early``) and calls ``on_exit`` as soon
    as the server exits by itself: every call to a server that is gone is retried for minutes by
    Prefect's client before the command hears of it. Set the event returned before stopping the
    server: an exit asked for is no news."""
    stopping = threading.Event()

    def watch() -> None:
        while not stopping.wait(EXIT_POLL_S):
            if process.poll() is not None:
                if not stopping.is_set():
                    _EXITED.append((process.returncode, log))
                    on_exit()
                return

    threading.Thread(target=watch, name="prefect-server-watch", daemon=True).start()
    return stopping


@contextlib.contextmanager
def prefect_server(home: Path, timeout_s: float = START_TIMEOUT_S, database_url: str | None = None,
                   services: bool = True, own: bool = False, log_name: str = LOG_NAME,
                   on_exit: Callable[[], None] | None = None) -> Iterator[str]:
    """`prefect server start` on a free loopback port with ``home`` as its Prefect home (its log
    ``log_name`` there) and its database ``database_url`` (default: the one this process's settings name,
    the home's ``prefect.db`` unless set), its API URL while the block runs; stopped after, the clients'
    pending logs and events sent to it first. ``own``: the command's own server, whose early exit
    ``exited_early`` reports, and ``on_exit`` is called at once (``watch_exit``); ``services=False``:
    none of its services (a server only read from)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home.mkdir(parents=True, exist_ok=True)
    log = home / log_name
    env = server_environment(home)
    if database_url is not None:
        for name in [name for name in env if name.startswith(DATABASE_SETTINGS)]:
            del env[name]
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url

    def start(port: int) -> subprocess.Popen:
        command = [prefect_executable(), "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                   "--analytics-off", *([] if services else ["--no-services"])]
        with open(log, "ab") as out:
            return subprocess.Popen(lifeline.command(command), env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)

    port, process = start_listening(
        start, lambda process, port: wait_until_healthy(process, api_url_of(port), log, timeout_s), timeout_s)
    stopping = watch_exit(process, log, on_exit) if own and on_exit is not None else threading.Event()
    try:
        try:
            yield api_url_of(port)
        finally:
            if process.poll() is None:  # a server that is gone takes nothing: the drain would wait and fail
                with temporary_settings(updates={PREFECT_API_URL: api_url_of(port)}):
                    flush_clients()
    finally:
        stopping.set()
        stop(process, log if own else None)


def sqlite_url(home: Path) -> str:
    """The URL of a Prefect home's own database, ``prefect.db`` (Prefect's default)."""
    return f"sqlite+aiosqlite:///{Path(home).resolve() / 'prefect.db'}"


def api_url_of(port: int) -> str:
    return f"http://127.0.0.1:{port}/api"


def flush_clients() -> None:
    """Send this process's pending Prefect logs and events while the server still runs; left for
    exit, they would wait on a server that is gone."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)
    EventsWorker.drain_all(timeout=30)
