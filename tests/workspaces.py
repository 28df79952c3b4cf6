"""Helpers for flow tests that share expensive arrangement: a temporary Prefect server (per test
or per module, see conftest.py), a trained workspace copied for each test instead of trained again
(``copy_workspace``), the CLI called with its output captured where capsys cannot be used
(module-scoped fixtures)."""

from __future__ import annotations

import contextlib
import io
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

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

