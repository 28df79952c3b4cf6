"""The CLI's runs copied between two real Prefect servers (``runtime.run_history.copy_cli_runs``):
a Prefect home whose own server ran a deletion-batch-like flow (a subflow, tasks, a markdown and a
table artifact, a log line) and a run left Running, then a served server in another home (on a
PostgreSQL database where the session has a cluster, else SQLite). The copy reads the old database
through a server of its own; a second copy adds nothing. Two or three server starts, tens of seconds:
`make reliability` runs it; tests/test_run_history.py checks the same copy in memory in `make test`."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.settings import PREFECT_API_URL, temporary_settings

from runtime.local_server import flush_clients, prefect_server
from runtime.run_history import COPIED_LABEL, COPY_TAG, client_of, copy_cli_runs, copy_runs

FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = pytest.mark.skipif(not FULL, reason="tens of seconds (three Prefect servers): runs under "
                                                 "`make reliability` (RELIABILITY_FULL=1)")


@task
def double(x: int) -> int:
    return 2 * x


@flow(name="train-audit-references")
def audit(x: int) -> int:
    return double(x)


@flow(name="process-deletions")
def batch(x: int) -> int:
    y = double(x)
    create_markdown_artifact(markdown="# Receipt\nforgotten", key="deletion-receipt", description="receipt")
    z = audit(y)
    create_table_artifact(table=[{"version": 2, "alias": "current"}], key="deletion-batch-models")
    get_run_logger().info("batch done")
    return z


async def wait_for_task_runs(api: str, count: int, timeout_s: float = 60) -> None:
    """The server's task-run recorder writes task runs from events: wait until it has."""
    deadline = time.monotonic() + timeout_s
    async with client_of(api) as client:
        while len(await client.read_task_runs()) < count:
            assert time.monotonic() < deadline, "the source server did not record the task runs"
            await asyncio.sleep(0.5)


async def left_running(api: str) -> None:
    """A run a killed command left Running."""
    from prefect.states import Running

    async with client_of(api) as client:
        await client.create_flow_run(audit, name="killed-midway", state=Running())


async def copy_between(source_api: str, target_api: str):
    async with client_of(source_api) as source, client_of(target_api) as target:
        return await copy_runs(source, target)


async def served_view(api: str) -> dict:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    async with client_of(api) as client:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[COPY_TAG])))
        names = {run.name: (await client.read_flow(run.flow_id)).name for run in runs}
        tasks = await client.read_task_runs()
        return {"runs": {names[run.name]: run for run in runs}, "tasks": {task.id: task for task in tasks},
                "artifacts": await client.read_artifacts(), "logs": await client.read_logs()}


def test_the_clis_runs_reach_the_served_server_once(tmp_path: Path, prefect_databases):
    cli_home = tmp_path / "workspace" / ".prefect"
    with prefect_server(cli_home) as api, temporary_settings(updates={PREFECT_API_URL: api}):
        # Prefect keeps one events worker per process, bound to the server it first sent to: an earlier
        # test's would take these events to its own server. Drained, the next event starts one for this.
        flush_clients()
        assert batch(3) == 12
        asyncio.run(wait_for_task_runs(api, 3))  # two doubles and the subflow's parent task run
        asyncio.run(left_running(api))

    database = prefect_databases.new() if prefect_databases else None
    with prefect_server(tmp_path / "served", database_url=database) as served:
        started = time.monotonic()
        report = copy_cli_runs(cli_home, served)
        took = time.monotonic() - started
        view = asyncio.run(served_view(served))
        again = copy_cli_runs(cli_home, served)
        onto_itself = asyncio.run(copy_between(served, served))  # a server holding the originals gets nothing
        after = asyncio.run(served_view(served))

    assert sorted(report.flow_runs)[0].startswith("process-deletions/") and len(report.flow_runs) == 2, report
    assert (report.task_runs, report.artifacts, report.unfinished) == (3, 2, 1), report
    assert set(view["runs"]) == {"process-deletions", "train-audit-references"}
    copy, subflow = view["runs"]["process-deletions"], view["runs"]["train-audit-references"]
    assert copy.state.type.value == subflow.state.type.value == "COMPLETED" and COPIED_LABEL in copy.labels
    assert "on the CLI's own Prefect server" in copy.state.message
    assert copy.parameters == {"x": 3}
    assert view["tasks"][subflow.parent_task_run_id].flow_run_id == copy.id  # the subflow under its parent
    assert {(a.key, a.flow_run_id) for a in view["artifacts"]} == {("deletion-receipt", copy.id),
                                                                   ("deletion-batch-models", copy.id)}
    assert "forgotten" in next(a.data for a in view["artifacts"] if a.key == "deletion-receipt")
    assert any(log.message == "batch done" and log.flow_run_id == copy.id for log in view["logs"])
    assert (again.flow_runs, again.already, again.unfinished) == ([], 2, 1)
    assert onto_itself.same_database and onto_itself.flow_runs == []
    assert [len(after[k]) for k in ("runs", "tasks", "artifacts")] == [len(view[k]) for k in ("runs", "tasks",
                                                                                              "artifacts")]
    print(f"\ncopied {report.line()} in {took:.1f} s (a server over the old database started included)")
