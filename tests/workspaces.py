"""Helpers for flow tests that share expensive arrangement: a temporary Prefect server (one
per session, see conftest.py), a trained workspace copied for each test instead of trained again
(``copy_workspace``), the CLI called with its output captured where capsys cannot be used
(module-scoped fixtures)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def temporary_prefect_server(home: Path):
    """A temporary Prefect server (its own database) with ``home`` as the Prefect home."""
    from prefect.settings import PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home.mkdir(parents=True, exist_ok=True)
    with temporary_settings(updates={PREFECT_HOME: str(home)}):
        with prefect_test_harness(server_startup_timeout=120):
            yield home


def copy_workspace(source: Path, destination: Path) -> Path:
    """A copy of the workspace ``source`` at ``destination``, as if everything done in ``source``
    had been done there: DVC's files hold relative paths only, but the sqlite MLflow store holds
    absolute artifact locations (experiments', runs'), rewritten to the copy. ``source`` must be
    idle (no run writing to it)."""
    source, destination = Path(source).resolve(), Path(destination).resolve()
    shutil.copytree(source, destination, symlinks=True)
    old, new = f"{source}/", f"{destination}/"
    store = destination / "mlflow" / "mlflow.db"
    if store.is_file():
        with contextlib.closing(sqlite3.connect(store)) as db, db:
            tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            for table in tables:
                columns = [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')
                           if any(kind in row[2].upper() for kind in ("CHAR", "TEXT", "CLOB"))]
                for column in columns:
                    db.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) '
                               f'WHERE instr("{column}", ?) > 0', (old, new, old))
                    assert not db.execute(f'SELECT count(*) FROM "{table}" WHERE instr("{column}", ?) > 0',
                                          (old,)).fetchone()[0], (table, column)
    stale = [str(p) for p in destination.rglob("*") if p.is_file() and p != store and old.encode() in p.read_bytes()]
    assert not stale, f"files of the copy name the original workspace: {stale}"
    return destination


@dataclass
class Printed:
    """What a CLI call returned and printed."""

    status: int
    out: str
    err: str


def call_cli(workspace: Path, *args: str) -> Printed:
    """``fedunlearn --root <workspace> ARGS`` in this process, its output captured without capsys
    (which module-scoped fixtures cannot use)."""
    from cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["--root", str(workspace), *args])
    return Printed(status, out.getvalue(), err.getvalue())



class TrainedWorkspaces:
    """Workspaces trained once per session, by name, that tests copy (``copy_workspace``) instead of
    training again. Training runs against a Prefect server of this object's own (`prefect server
    start`, API only), started on first use: whatever server the requesting test module uses is
    untouched, and the training's flow runs are in no test's Prefect database."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.trained: dict[str, tuple[Path, object]] = {}
        self.server = None
        self.api_url = ""

    def get(self, name: str, train: Callable[[Path], object]) -> tuple[Path, object]:
        """The workspace ``name`` after ``train(workspace)`` ran in it once, and what it returned."""
        if name not in self.trained:
            workspace = init_workspace_at(self.directory / name / "workspace")
            with self.api():
                result = train(workspace)
            self.trained[name] = (workspace, result)
        return self.trained[name]

    @contextlib.contextmanager
    def api(self):
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker
        from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

        if self.server is None:
            self.start()
        with temporary_settings(updates={PREFECT_API_URL: self.api_url, PREFECT_HOME: str(self.directory / "home")}):
            try:
                yield
            finally:  # flushed while the server runs: left for later they would wait on it at exit
                APILogWorker.drain_all(timeout=30)
                EventsWorker.drain_all(timeout=30)

    def start(self, timeout_s: float = 120) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        home = self.directory / "server-home"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)
        self.api_url = f"http://127.0.0.1:{port}/api"
        with open(home / "server.log", "wb") as log:
            self.server = subprocess.Popen(
                [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                 str(port), "--no-services", "--no-ui", "--analytics-off"],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"the Prefect server exited:\n{(home / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the Prefect server did not answer:\n{(home / 'server.log').read_text()}")
                time.sleep(0.2)

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()


def init_workspace_at(root: Path) -> Path:
    from stores.workspace import init_workspace

    return init_workspace(root, template=PROJECT_ROOT)


def cli_training(scenario: str) -> Callable[[Path], None]:
    """``fedunlearn train --scenario <scenario> --inline``, as a ``TrainedWorkspaces`` training."""
    def train(workspace: Path) -> None:
        trained = call_cli(workspace, "train", "--scenario", scenario, "--inline")
        assert trained.status == 0, trained.err
    return train
