"""Helpers for flow tests that share expensive arrangement: a temporary Prefect server (one
per session, see conftest.py; every test server is a ``PrefectServer``, its database on a
throwaway PostgreSQL cluster where one can be made), a trained workspace copied for each test
instead of trained again (``copy_workspace``), the CLI called with its output captured where
capsys cannot be used (module-scoped fixtures)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from runtime.local_server import SERVED_ONLY_SERVICES, flush_clients, free_port, wait_until_healthy

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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
    forget_artifact_locations()
    return destination


def forget_artifact_locations() -> None:
    """MLflow caches each run's artifact store by run ID for the whole process: a copy's runs have
    the source's IDs, so an artifact logged to one of them would land in the source workspace."""
    from mlflow.tracking._tracking_service import utils as tracking_utils

    tracking_utils._artifact_repos_cache.clear()


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
    untouched, and the training's flow runs are in no test's Prefect database. Its database is
    ``database_url`` (a ``PostgresDatabases.new()``), else a SQLite file in its home."""

    def __init__(self, directory: Path, database_url: str | None = None):
        self.directory, self.database_url = directory, database_url
        self.trained: dict[str, tuple[Path, object]] = {}
        self.server: PrefectServer | None = None
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
        from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

        if self.server is None:
            self.start()
        with temporary_settings(updates={PREFECT_API_URL: self.api_url, PREFECT_HOME: str(self.directory / "home")}):
            try:
                yield
            finally:
                flush_clients()  # while the server runs

    def start(self) -> None:
        self.server = PrefectServer(self.directory / "server-home", self.database_url, services=False)
        self.api_url = self.server.start()

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


class PostgresDatabases:
    """A throwaway PostgreSQL cluster (``stores.postgres.LocalCluster`` in a temporary directory) from
    which each test Prefect server takes a database of its own. SQLite, the alternative, lets one
    writer in at a time: a server's task-run recorder that met the lock waited out SQLite's busy
    timeout (a minute) before a flow run's final state was recorded."""

    def __init__(self, server):
        self.server, self.count = server, 0

    def new(self) -> str:
        """The URL (Prefect's asyncpg driver) of a new, empty database on the cluster."""
        from stores import postgres

        self.count += 1
        name = f"prefect_{self.count}"
        postgres.create_databases(self.server, (name,))
        return self.server.url(name, "asyncpg")


@contextlib.contextmanager
def throwaway_postgres():
    """``PostgresDatabases`` on a cluster made for the session, stopped and removed at the end; None
    where PostgreSQL's server binaries are missing (the test servers then keep SQLite)."""
    from stores import postgres

    try:
        postgres.binaries()
    except postgres.PostgresMissing:
        yield None
        return
    directory = Path(tempfile.mkdtemp(prefix="fedunlearn-test-pg-"))
    directory.chmod(0o711)  # run as root, the cluster runs as the user 'postgres', who must reach it
    cluster = postgres.LocalCluster(directory / ".postgres")
    try:
        port = cluster.start()
        yield PostgresDatabases(postgres.Server("127.0.0.1", port, postgres.ROLE, cluster.pgpass))
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


class PrefectServer:
    """`prefect server start` (API only) on a free loopback port, its home ``home`` (its log there),
    its database ``database_url`` or a SQLite file in ``home``; with the ephemeral server's services
    (``services=True``) or none; its environment ``env`` (default: this process's) otherwise."""

    def __init__(self, home: Path, database_url: str | None = None, services: bool = True,
                 env: dict[str, str] | None = None):
        self.home, self.database_url, self.services = home, database_url, services
        self.base_env = dict(os.environ if env is None else env)
        self.log = home / "server.log"
        self.process: subprocess.Popen | None = None
        self.api_url = ""

    def environment(self) -> dict[str, str]:
        env = {**self.base_env, "PREFECT_HOME": str(self.home)}
        env.pop("PREFECT_API_URL", None)
        if self.database_url:
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = self.database_url
        # The services of Prefect's temporary server (as the CLI's own server runs them): none of the
        # loops that would act on a test's runs between its steps (scheduler, late runs, ...).
        env.update({f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in SERVED_ONLY_SERVICES})
        return env

    def launch(self) -> str:
        """Start it (``wait_until_healthy`` waits for it); its API URL."""
        port = free_port()
        self.home.mkdir(parents=True, exist_ok=True)
        args = [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                str(port), "--no-ui", "--analytics-off", *([] if self.services else ["--no-services"])]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(args, env=self.environment(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.api_url = f"http://127.0.0.1:{port}/api"
        return self.api_url

    def wait_until_healthy(self, timeout_s: float = 120) -> str:
        wait_until_healthy(self.process, self.api_url, self.log, timeout_s)
        return self.api_url

    def start(self) -> str:
        """Start it; its API URL once it answers."""
        self.launch()
        return self.wait_until_healthy()

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the server's process group (the server and its uvicorn), SIGKILL if it lingers."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@contextlib.contextmanager
def temporary_prefect_server(home: Path, databases: PostgresDatabases | None = None):
    """A temporary Prefect server (its own database) with ``home`` as the Prefect home: on a database
    of ``databases`` where there is a cluster, else Prefect's test harness (SQLite)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home.mkdir(parents=True, exist_ok=True)
    if databases is None:
        with temporary_settings(updates={PREFECT_HOME: str(home)}):
            with prefect_test_harness(server_startup_timeout=120):
                yield home
        return
    server = PrefectServer(home / "server", databases.new())
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.start(), PREFECT_HOME: str(home)}):
            try:
                yield home
            finally:
                flush_clients()  # while the server runs
    finally:
        server.stop()


def init_workspace_at(root: Path) -> Path:
    from stores.workspace import init_workspace

    return init_workspace(root, template=PROJECT_ROOT)


def add_sharded_digits(root: Path, scenario: str, rounds: int, shards: int = 2) -> None:
    """The workspace's params.yaml with ``scenario``: digits on 4 HFL clients in ``shards`` shards (1:
    one federation), ``rounds`` rounds."""
    text = (root / "params.yaml").read_text()
    (root / "params.yaml").write_text(text.replace("scenarios:\n", f"""scenarios:
  {scenario}:
    dataset: digits
    setting: hfl
    model: cnn
    shards: {shards}
    partition: {{scheme: dirichlet, num_clients: 4, alpha: 0.5, test_fraction: 0.2}}
    train: {{rounds: {rounds}, local_epochs: 3, lr: 0.1, batch_size: 16}}
""", 1))


def cli_training(scenario: str) -> Callable[[Path], None]:
    """``fedunlearn train --scenario <scenario> --inline``, as a ``TrainedWorkspaces`` training."""
    def train(workspace: Path) -> None:
        trained = call_cli(workspace, "train", "--scenario", scenario, "--inline")
        assert trained.status == 0, trained.err
    return train


def status_row(out: str, request_id: str) -> list[str]:
    """The cells of ``request_id``'s row in `fedunlearn status`'s table as a terminal shows it (plain
    text, columns apart by spaces): the request, its state, ... ."""
    [row] = [line.split() for line in out.splitlines() if line.split()[:1] == [request_id]]
    return row
