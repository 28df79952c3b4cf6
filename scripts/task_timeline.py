"""The task runs of a workspace's latest ``process-deletions`` flow run (its sub-flows included),
with their wall seconds, read from the Prefect database the CLI left in the workspace (or, for a
workspace served on PostgreSQL, its ``prefect`` database; its cluster must run): where a
batch's time goes, and whether its evaluation (``build-evaluator``, ``evaluate-*``,
``audit-*``) stays within its unlearning (``unlearn-*``).

    .venv/bin/python scripts/task_timeline.py WORKSPACE [--flow process-deletions] [--runs 1]
"""

from __future__ import annotations

import argparse
import sqlite3
from collections import defaultdict
from datetime import datetime
from pathlib import Path

GROUPS = {"unlearning": ("unlearn-",), "evaluation": ("build-evaluator", "evaluate-", "audit-", "gates-")}
# process-deletions' stages: task runs whose steps nest under them, counted there
STAGES = {"intake-requests", "apply-deletions", "unlearn-and-register", "promote-and-receipt"}


def seconds(start: str | datetime | None, end: str | datetime | None) -> float:
    if not start or not end:
        return 0.0
    as_time = lambda value: value if isinstance(value, datetime) else datetime.fromisoformat(value)  # noqa: E731
    return (as_time(end) - as_time(start)).total_seconds()


class Postgres:
    """The ``execute(sql, params)`` of sqlite3 over the workspace's PostgreSQL ``prefect`` database."""

    def __init__(self, workspace: Path):
        from stores.postgres import connect, workspace_server

        self.connection = connect(workspace_server(workspace, start=False), "prefect")

    def execute(self, sql: str, params=()) -> list[tuple]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql.replace("?", "%s"), tuple(params))
            return cursor.fetchall()


def open_database(workspace: Path):
    return Postgres(workspace) if (workspace / ".postgres" / "workspace.json").is_file() else \
        sqlite3.connect(workspace / ".prefect" / "prefect.db")


def flow_runs(db, name: str, count: int) -> list[tuple[str, str]]:
    return db.execute("SELECT flow_run.id, flow_run.name FROM flow_run JOIN flow ON flow.id = flow_run.flow_id "
                      "WHERE flow.name = ? AND flow_run.parent_task_run_id IS NULL "
                      "ORDER BY flow_run.start_time DESC LIMIT ?", (name, count))


def descendants(db, flow_run_id: str) -> list[str]:
    """The flow run and its sub-flow runs, recursively."""
    found, frontier = [flow_run_id], [flow_run_id]
    while frontier:
        children = [row[0] for row in db.execute(
            "SELECT flow_run.id FROM flow_run JOIN task_run ON flow_run.parent_task_run_id = task_run.id "
            f"WHERE task_run.flow_run_id IN ({','.join('?' * len(frontier))})", list(frontier))]
        found += children
        frontier = children
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workspace", type=Path)
    parser.add_argument("--flow", default="process-deletions")
    parser.add_argument("--runs", type=int, default=1, help="the latest N runs (default 1)")
    args = parser.parse_args()
    db = open_database(args.workspace)
    for run_id, run_name in flow_runs(db, args.flow, args.runs):
        ids = descendants(db, run_id)
        rows = db.execute("SELECT id, name, start_time, end_time FROM task_run WHERE flow_run_id IN "
                          f"({','.join('?' * len(ids))}) ORDER BY start_time", ids)
        # A sub-flow appears as a task run of its parent too (``train-federated``): its time is
        # that of the task runs inside it, counted there.
        wrappers = {row[0] for row in db.execute("SELECT parent_task_run_id FROM flow_run WHERE parent_task_run_id "
                                                 "IS NOT NULL")}
        totals = defaultdict(float)
        print(f"## {args.flow} run {run_name}")
        for task_run_id, name, start, end in rows:
            wall = seconds(start, end)
            print(f"{wall:8.2f} s  {name}{'  (sub-flow)' if task_run_id in wrappers else ''}")
            for group, prefixes in GROUPS.items():
                if task_run_id not in wrappers and name not in STAGES and name.startswith(prefixes):
                    totals[group] += wall
        print(" ".join(f"{group} {totals[group]:.1f} s" for group in GROUPS)
              + f"; evaluation / unlearning = {totals['evaluation'] / max(totals['unlearning'], 1e-9):.2f}\n")


if __name__ == "__main__":
    main()
