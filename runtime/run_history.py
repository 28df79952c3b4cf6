"""The flow runs the CLI recorded in the workspace's Prefect home, copied into the served Prefect
server (``make serve``) through Prefect's client API.

A CLI command run while nothing serves the workspace runs its flows on a Prefect server of its own
over the Prefect home's database, ``.prefect/prefect.db`` (``runtime.local_server``). ``make serve``
on PostgreSQL serves another database, so its UI would show none of that history: not `make demo`'s
deletion batch, nor its receipt and status artifacts. Before it serves the deployments, serve runs
``fedunlearn served copy-runs``: a server of its own over the old database (no services: it is only
read) and the served one, a client of each (``get_client``), and every finished run copied:

- the flow (by name) and the flow run: name, parameters, tags and the tag ``from-cli``; a subflow
  under its parent's copied task run;
- its task runs: name, task key, dynamic key, tags, inputs (pointing at the copies);
- states: Running, then the run's final state (type, name, message). The API stamps a state with
  the time it is set and takes no other, so a copy's start and end are those of the copy; the
  original ones are in the final state's message;
- its artifacts (key, type, description, data, metadata) on the new flow and task runs, in the order
  they were made, so that a key's latest stays its latest;
- its logs, with their original timestamps.

Prefect's tables are not copied row by row: their schema is Prefect's own, and ``prefect transfer``
moves flows, deployments, blocks and the like but no runs. What was copied is recorded on the copies:
the label ``fedunlearn.copied-from`` (the source flow run's ID), set last, once a run is whole, so a
second copy skips it and a copy cut short (``fedunlearn.copying-from`` alone) is deleted, its
artifacts first, and made again. The record travels with the served database: a new one gets the
history again, one that has it never gets it twice. A run that has not finished (running, pending,
scheduled) is left for a later serve. On SQLite, serve's server opens the home's own database:
there is nothing to copy (``shares_database``, from the settings serve.sh gives its server; a
server found to hold the originals themselves gets nothing either).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable
from uuid import UUID, uuid4

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.objects import FlowRun, State, TaskRun

COPY_TAG = "from-cli"
SOURCE_LOG = "copy-runs-server.log"  # the log of the server over the old database, in the Prefect home
COPIED_LABEL = "fedunlearn.copied-from"  # set once the copy is whole
COPYING_LABEL = "fedunlearn.copying-from"  # set as the copy starts
PAGE = 200  # the server's default and largest page
PARALLEL = 8  # task runs written at once
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
NOT_STARTED = ("SCHEDULED", "PENDING")


@dataclass
class CopyReport:
    """What one copy did: runs, task runs, artifacts and log lines copied; finished runs already there;
    runs left (not finished); copies cut short that were made again."""

    flow_runs: list[str] = field(default_factory=list)  # "flow/run" of each copied flow run
    task_runs: int = 0
    artifacts: int = 0
    logs: int = 0
    already: int = 0
    unfinished: int = 0
    redone: int = 0
    same_database: bool = False

    def line(self) -> str:
        if self.same_database:
            return "the served Prefect server uses the CLI's own database (.prefect/prefect.db): its runs are there"
        left = f"; {self.unfinished} not finished, left for a later serve" if self.unfinished else ""
        there = f"; {self.already} copied before" if self.already else ""
        if not self.flow_runs:
            return f"no new runs of the CLI to bring into the served Prefect server{there}{left}"
        batches = sum(name.startswith("process-deletions/") for name in self.flow_runs)
        return (f"brought {len(self.flow_runs)} flow runs of the CLI into the served Prefect server (tag {COPY_TAG}"
                f"{f'; {batches} deletion batch(es)' if batches else ''}): {self.task_runs} task runs, "
                f"{self.artifacts} artifacts, {self.logs} log lines{there}{left}")


def shares_database(home: Path, database_url: str) -> bool:
    """Whether a server on ``database_url`` (a SQLAlchemy URL) opens the Prefect home's own database."""
    scheme, _, path = database_url.partition(":///")
    return scheme.startswith("sqlite") and Path(path).resolve() == (Path(home) / "prefect.db").resolve()


def served_database_url() -> str:
    """The database a Prefect server started with this process's settings opens (serve.sh exports
    the served server's)."""
    from prefect.settings import get_current_settings

    return get_current_settings().server.database.connection_url.get_secret_value()


def copy_cli_runs(home: Path, target_api: str, timeout_s: float | None = None) -> CopyReport:
    """Copy the finished runs of the Prefect home ``home``'s database into the server at ``target_api``
    (module docstring); nothing when that server opens the same database."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from runtime.local_server import START_TIMEOUT_S, flush_clients, prefect_server, sqlite_url

    home = Path(home).resolve()
    if shares_database(home, served_database_url()):
        return CopyReport(same_database=True)
    if not (home / "prefect.db").is_file():
        return CopyReport()
    with prefect_server(home, timeout_s or START_TIMEOUT_S, database_url=sqlite_url(home), services=False,
                        log_name=SOURCE_LOG) as source:
        # The client's own events (an artifact's creation) go to the served server, as the copies do.
        with temporary_settings(updates={PREFECT_API_URL: target_api}):
            try:
                return asyncio.run(_copy_between(source, target_api))
            finally:
                flush_clients()


async def _copy_between(source_api: str, target_api: str) -> CopyReport:
    async with client_of(source_api) as source, client_of(target_api) as target:
        return await copy_runs(source, target)


def client_of(api_url: str) -> PrefectClient:
    """``get_client()`` for the server at ``api_url`` (the setting read as the client is made)."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        return get_client()


async def copy_runs(source: PrefectClient, target: PrefectClient) -> CopyReport:
    """Copy every finished flow run of ``source`` not yet in ``target`` (module docstring)."""
    from prefect.client.schemas.sorting import FlowRunSort

    report = CopyReport()
    copied, cut_short = await copies_in(target)
    report.redone = await discard(target, cut_short)
    runs = await paged(source.read_flow_runs, sort=FlowRunSort.ID_DESC)
    todo = [run for run in runs if str(run.id) not in copied and finished(run)]
    report.already = sum(str(run.id) in copied for run in runs)
    report.unfinished = sum(str(run.id) not in copied and not finished(run) for run in runs)
    if not todo:
        return report
    if await holds(target, todo[0].id):  # the same database after all (settings other than serve.sh's)
        return CopyReport(same_database=True)
    tasks = await task_runs_of(source, [run.id for run in todo])
    ids = Ids(flow_runs={}, task_runs={task.id: uuid4() for task in tasks})
    names = {flow_id: (await source.read_flow(flow_id)).name for flow_id in {run.flow_id for run in todo}}
    await copy_in_order(target, todo, tasks, names, ids)
    report.flow_runs = [f"{names[run.flow_id]}/{run.name}" for run in sorted(todo, key=made)]
    report.task_runs = len(tasks)
    report.artifacts = await copy_artifacts(source, target, ids)
    report.logs = await copy_logs(source, target, ids)
    for run in todo:
        await finish_copy(target, run, ids.flow_runs[run.id])
    return report


async def copy_in_order(target: PrefectClient, runs: list[FlowRun], tasks: list[TaskRun], names: dict[UUID, str],
                        ids: Ids) -> None:
    """The flow runs and task runs made in ``target`` in the order the originals were made: a flow run
    before its task runs, a subflow's parent task run before the subflow, a task run after the
    subflow whose result it takes. Task runs between two flow runs are made together."""
    from prefect.client.schemas.objects import FlowRun as FlowRunModel

    by_id, made_already, waiting = {task.id: task for task in tasks}, set(), {}

    async def make_waiting() -> None:
        await bounded(copy_task_run(target, task, ids) for task in waiting.values())
        made_already.update(waiting)
        waiting.clear()

    for item in sorted([*runs, *tasks], key=made):
        if not isinstance(item, FlowRunModel):
            if item.id not in made_already:
                waiting[item.id] = item
            continue
        parent = item.parent_task_run_id
        if parent in by_id and parent not in made_already:  # made first, wherever its clock put it
            waiting[parent] = by_id[parent]
        await make_waiting()
        ids.flow_runs[item.id] = await start_copy(target, item, names[item.flow_id], ids)
    await make_waiting()


@dataclass
class Ids:
    """The copies' IDs by the originals': flow runs as they are made, task runs chosen beforehand
    (the API takes a task run's ID), so inputs and subflows can point at copies not yet made."""

    flow_runs: dict[UUID, UUID]
    task_runs: dict[UUID, UUID]


async def holds(target: PrefectClient, flow_run_id: UUID) -> bool:
    """Whether ``target`` has the flow run ``flow_run_id`` (an original's ID: copies get IDs of their own)."""
    from prefect.exceptions import ObjectNotFound

    try:
        await target.read_flow_run(flow_run_id)
    except ObjectNotFound:
        return False
    return True


def finished(run: FlowRun) -> bool:
    return run.state is not None and run.state.type.value in FINAL


def made(run: FlowRun | TaskRun) -> datetime:
    return run.created or run.expected_start_time or datetime.min.replace(tzinfo=timezone.utc)


async def paged(read: Callable[..., Awaitable[list]], **filters: Any) -> list:
    """Every item a ``read_*`` client method finds, page by page (each once: a sort with ties, such as
    logs by timestamp, may repeat one at a page's edge)."""
    items: dict = {}
    offset = 0
    while True:
        page = await read(**filters, limit=PAGE, offset=offset)
        items.update((item.id, item) for item in page)
        offset += len(page)
        if len(page) < PAGE:
            return list(items.values())


async def bounded(calls: Iterable[Awaitable[Any]]) -> list:
    """Await ``calls`` with at most ``PARALLEL`` at once."""
    gate = asyncio.Semaphore(PARALLEL)

    async def one(call: Awaitable[Any]) -> Any:
        async with gate:
            return await call

    return await asyncio.gather(*(one(call) for call in calls))


async def copies_in(target: PrefectClient) -> tuple[set[str], list[FlowRun]]:
    """The source IDs of the whole copies in ``target``, and the copies cut short."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    tagged = await paged(target.read_flow_runs, sort=FlowRunSort.ID_DESC,
                         flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[COPY_TAG])))
    whole = {run.labels[COPIED_LABEL] for run in tagged if COPIED_LABEL in (run.labels or {})}
    cut_short = [run for run in tagged if COPYING_LABEL in (run.labels or {}) and COPIED_LABEL not in run.labels]
    return whole, cut_short


async def discard(target: PrefectClient, runs: list[FlowRun]) -> int:
    """Delete copies cut short: their artifacts, then the runs (their task runs go with them)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort
    from prefect.exceptions import ObjectNotFound

    if not runs:
        return 0
    ids = [run.id for run in runs]
    for artifact in await paged(target.read_artifacts, sort=ArtifactSort.ID_DESC,
                                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids))):
        await target.delete_artifact(artifact.id)
    for run_id in ids:
        with contextlib.suppress(ObjectNotFound):  # gone already
            await target.delete_flow_run(run_id)
    return len(runs)


async def task_runs_of(source: PrefectClient, flow_run_ids: list[UUID]) -> list[TaskRun]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    return await paged(source.read_task_runs, flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=flow_run_ids)),
                       sort=TaskRunSort.ID_DESC)


async def start_copy(target: PrefectClient, run: FlowRun, flow_name: str, ids: Ids) -> UUID:
    """The flow run made in ``target`` (Pending, then Running), labelled as a copy in progress."""
    from prefect import Flow
    from prefect.states import Pending, Running

    flow = Flow(fn=recorded, name=flow_name, version=run.flow_version)
    copy = await target.create_flow_run(
        flow, name=run.name, parameters=run.parameters, tags=[*run.tags, COPY_TAG],
        parent_task_run_id=ids.task_runs.get(run.parent_task_run_id), state=Pending())
    await target.update_flow_run_labels(copy.id, {COPYING_LABEL: str(run.id)})
    await target.set_flow_run_state(copy.id, Running(), force=True)
    return copy.id


def recorded() -> None:
    """The stand-in function of a copied flow or task: the copy is a record, never run."""


async def copy_task_run(target: PrefectClient, task: TaskRun, ids: Ids) -> None:
    """The task run made in ``target`` under its flow run's copy, with its ID chosen in ``ids``; Running,
    then its final state (one not started keeps its state)."""
    from prefect import Task
    from prefect.states import Running

    stand_in = Task(fn=recorded, name=task.name)
    stand_in.task_key = task.task_key  # the original's: the UI groups task runs by it
    started = task.state is not None and task.state.type.value not in NOT_STARTED
    await target.create_task_run(
        stand_in, flow_run_id=ids.flow_runs[task.flow_run_id], dynamic_key=task.dynamic_key,
        id=ids.task_runs[task.id], name=task.name, extra_tags=task.tags,
        state=Running() if started else state_like(task.state), task_inputs=mapped_inputs(task, ids))
    if started and task.state.type.value != "RUNNING":
        await target.set_task_run_state(ids.task_runs[task.id], state_like(task.state), force=True)


def state_like(state: State | None, message: str | None = None) -> State:
    """A new state of ``state``'s type and name (Pending for none), with its message or ``message``."""
    from prefect.client.schemas.objects import State as StateModel, StateType

    if state is None:
        return StateModel(type=StateType.PENDING)
    return StateModel(type=state.type, name=state.name, message=message if message is not None else state.message)


def mapped_inputs(task: TaskRun, ids: Ids) -> dict[str, list]:
    """The task's inputs with the runs they name replaced by their copies (the copied ones only)."""
    mapped = {}
    for name, inputs in (task.task_inputs or {}).items():
        kept = []
        for item in inputs:
            run_id = getattr(item, "id", None)
            if run_id is None:
                kept.append(item)
            elif getattr(item, "input_type", "") == "task_run" and run_id in ids.task_runs:
                kept.append(item.model_copy(update={"id": ids.task_runs[run_id]}))
            elif getattr(item, "input_type", "") == "flow_run" and run_id in ids.flow_runs:
                kept.append(item.model_copy(update={"id": ids.flow_runs[run_id]}))
        mapped[name] = kept
    return mapped


async def copy_artifacts(source: PrefectClient, target: PrefectClient, ids: Ids) -> int:
    """The copied runs' artifacts, in the order they were made, on the copies."""
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.client.schemas.sorting import ArtifactSort

    artifacts = await paged(source.read_artifacts, sort=ArtifactSort.ID_DESC, artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=list(ids.flow_runs))))
    for artifact in sorted(artifacts, key=lambda artifact: artifact.created):
        await target.create_artifact(ArtifactCreate(
            key=artifact.key, type=artifact.type, description=artifact.description, data=artifact.data,
            metadata_=artifact.metadata_, flow_run_id=ids.flow_runs[artifact.flow_run_id],
            task_run_id=ids.task_runs.get(artifact.task_run_id)))
    return len(artifacts)


async def copy_logs(source: PrefectClient, target: PrefectClient, ids: Ids) -> int:
    """The copied runs' logs, with their own timestamps, on the copies."""
    from prefect.client.schemas.actions import LogCreate
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    logs = await paged(source.read_logs, log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=list(ids.flow_runs))))
    for start in range(0, len(logs), PAGE):
        await target.create_logs([
            LogCreate(name=log.name, level=log.level, message=log.message, timestamp=log.timestamp,
                      flow_run_id=ids.flow_runs[log.flow_run_id], task_run_id=ids.task_runs.get(log.task_run_id))
            for log in logs[start:start + PAGE]])
    return len(logs)


async def finish_copy(target: PrefectClient, run: FlowRun, copy_id: UUID) -> None:
    """The copy's final state (its message saying when the original ran), then the label that
    makes it whole."""
    await target.set_flow_run_state(copy_id, state_like(run.state, final_message(run)), force=True)
    await target.update_flow_run_labels(copy_id, {COPIED_LABEL: str(run.id)})


def final_message(run: FlowRun) -> str:
    def at(moment: datetime | None, shape: str) -> str:
        return moment.astimezone(timezone.utc).strftime(shape) if moment is not None else "?"

    when = (f"ran {at(run.start_time, '%Y-%m-%d %H:%M:%S')}–{at(run.end_time, '%H:%M:%S')} UTC on the CLI's own "
            f"Prefect server; copied here by make serve")
    return f"{run.state.message} ({when})" if run.state.message else when
