"""The CLI's runs copied into the served Prefect server (``runtime.run_history``), against two
in-memory stand-ins of Prefect's client (the subset the copy calls), so it runs in milliseconds:
what is copied and how it is linked, that a second copy adds nothing, that a copy cut short is made
again whole, and when there is nothing to copy. tests/reliability/test_run_history_servers.py does
the same between two real Prefect servers (seconds each)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from uuid import UUID, uuid4

import pytest
from prefect.client.schemas.objects import (Artifact, Flow, FlowRun, FlowRunResult, Log, Parameter, State,
                                            StateType, TaskRun, TaskRunResult)

from runtime.run_history import COPIED_LABEL, COPY_TAG, CopyReport, copy_runs, shares_database

T0 = datetime(2026, 11, 27, 7, 40, tzinfo=timezone.utc)


class FakeServer:
    """The records of a Prefect server and the client methods the copy uses, in memory."""

    def __init__(self, fail_on: str | None = None):
        self.flows: dict[UUID, Flow] = {}
        self.flow_runs: dict[UUID, FlowRun] = {}
        self.task_runs: dict[UUID, TaskRun] = {}
        self.artifacts: list[Artifact] = []
        self.logs: list[Log] = []
        self.states: dict[UUID, list[State]] = {}
        self.fail_on = fail_on  # a method that raises, as a server that stops answering would

    def __getattribute__(self, name):
        if name != "fail_on" and name == self.fail_on:
            raise ConnectionError(f"the server went away ({name})")
        return super().__getattribute__(name)

    # --- reads, filtered the way the copy filters
    async def read_flow_runs(self, flow_run_filter=None, limit=200, offset=0, **_):
        runs = list(self.flow_runs.values())
        if flow_run_filter is not None and flow_run_filter.tags is not None:
            runs = [run for run in runs if set(flow_run_filter.tags.all_) <= set(run.tags)]
        return runs[offset:offset + limit]

    async def read_flow_run(self, flow_run_id):
        from prefect.exceptions import ObjectNotFound

        if flow_run_id not in self.flow_runs:
            raise ObjectNotFound(http_exc=None)
        return self.flow_runs[flow_run_id]

    async def read_flow(self, flow_id):
        return self.flows[flow_id]

    async def read_task_runs(self, flow_run_filter=None, limit=200, offset=0, **_):
        wanted = set(flow_run_filter.id.any_)
        return [task for task in self.task_runs.values() if task.flow_run_id in wanted][offset:offset + limit]

    async def read_artifacts(self, artifact_filter=None, limit=200, offset=0, **_):
        wanted = set(artifact_filter.flow_run_id.any_)
        return [artifact for artifact in self.artifacts if artifact.flow_run_id in wanted][offset:offset + limit]

    async def read_logs(self, log_filter=None, limit=200, offset=0, **_):
        wanted = set(log_filter.flow_run_id.any_)
        return [log for log in self.logs if log.flow_run_id in wanted][offset:offset + limit]

    # --- writes, with the server's checks that matter here
    async def create_flow_run(self, flow, name, parameters, tags, parent_task_run_id, state):
        assert parent_task_run_id is None or parent_task_run_id in self.task_runs, "the parent task run is missing"
        flow_id = next((f.id for f in self.flows.values() if f.name == flow.name), None) or uuid4()
        self.flows.setdefault(flow_id, Flow(id=flow_id, name=flow.name))
        run = FlowRun(name=name, flow_id=flow_id, parameters=parameters, tags=list(tags), state=state,
                      parent_task_run_id=parent_task_run_id, created=datetime.now(timezone.utc))
        self.flow_runs[run.id], self.states[run.id] = run, [state]
        return run

    async def update_flow_run_labels(self, flow_run_id, labels):
        run = self.flow_runs[flow_run_id]
        self.flow_runs[flow_run_id] = run.model_copy(update={"labels": {**run.labels, **labels}})

    async def set_flow_run_state(self, flow_run_id, state, force=False):
        assert force
        self.flow_runs[flow_run_id] = self.flow_runs[flow_run_id].model_copy(update={"state": state})
        self.states[flow_run_id].append(state)

    async def create_task_run(self, task, flow_run_id, dynamic_key, id, name, extra_tags, state, task_inputs):
        assert flow_run_id in self.flow_runs and id not in self.task_runs
        self.task_runs[id] = TaskRun(id=id, name=name, flow_run_id=flow_run_id, task_key=task.task_key,
                                     dynamic_key=dynamic_key, tags=list(extra_tags), state=state,
                                     task_inputs=task_inputs, created=datetime.now(timezone.utc))
        self.states[id] = [state]

    async def set_task_run_state(self, task_run_id, state, force=False):
        assert force
        self.task_runs[task_run_id] = self.task_runs[task_run_id].model_copy(update={"state": state})
        self.states[task_run_id].append(state)

    async def create_artifact(self, artifact):
        assert artifact.flow_run_id in self.flow_runs
        self.artifacts.append(Artifact(**artifact.model_dump(), created=datetime.now(timezone.utc)))

    async def create_logs(self, logs):
        self.logs += [Log(**log.model_dump()) for log in logs]

    async def delete_artifact(self, artifact_id):
        self.artifacts = [artifact for artifact in self.artifacts if artifact.id != artifact_id]

    async def delete_flow_run(self, flow_run_id):
        del self.flow_runs[flow_run_id]
        self.task_runs = {key: task for key, task in self.task_runs.items() if task.flow_run_id != flow_run_id}


def cli_history() -> FakeServer:
    """A demo's history as the CLI's own server recorded it: a deletion batch with a subflow, tasks
    whose inputs name each other and the subflow, keyed artifacts made in turn, logs, and a run a
    killed command left Running."""
    source = FakeServer()
    batch_flow, audit_flow, train_flow = (Flow(name=n) for n in ("process-deletions", "train-audit-references",
                                                                   "train-federated"))
    source.flows = {f.id: f for f in (batch_flow, audit_flow, train_flow)}

    def run(flow, name, minute, state="COMPLETED", parent=None):
        made = FlowRun(name=name, flow_id=flow.id, tags=["deletions"], parameters={"scenario": "digits-hfl"},
                       state=State(type=StateType(state), message="All states completed."),
                       parent_task_run_id=parent, created=T0 + timedelta(minutes=minute),
                       start_time=T0 + timedelta(minutes=minute), end_time=T0 + timedelta(minutes=minute + 1))
        source.flow_runs[made.id] = made
        return made

    def task(flow_run, name, second, inputs=None):
        made = TaskRun(name=name, flow_run_id=flow_run.id, task_key=f"{name}-key", dynamic_key="0",
                       state=State(type=StateType.COMPLETED), task_inputs=inputs or {},
                       created=T0 + timedelta(seconds=second))
        source.task_runs[made.id] = made
        return made

    batch = run(batch_flow, "turquoise-condor", 1)
    validate = task(batch, "validate", 61)
    placeholder = task(batch, "train-audit-references", 62)
    audit = run(audit_flow, "educational-angelfish", 2, parent=placeholder.id)
    task(audit, "train-reference", 121)
    task(batch, "receipt", 180, inputs={"batch": [TaskRunResult(id=validate.id)],
                                         "audit": [FlowRunResult(id=audit.id)], "scenario": [Parameter(name="s")]})
    run(train_flow, "killed-midway", 5, state="RUNNING")
    for minute, key in ((3, "deletion-receipt"), (4, "deletion-status-digits-hfl"), (3.5, "deletion-batch")):
        source.artifacts.append(Artifact(key=key, type="markdown", data=f"# {key}", flow_run_id=batch.id,
                                         task_run_id=validate.id, created=T0 + timedelta(minutes=minute)))
    source.logs = [Log(name="prefect.flow_runs", level=20, message=f"line {i}", flow_run_id=batch.id,
                       timestamp=T0 + timedelta(seconds=i)) for i in range(250)]
    return source


def copies(target: FakeServer) -> dict[str, FlowRun]:
    return {run.name: run for run in target.flow_runs.values()}


def test_the_finished_runs_are_copied_with_their_tasks_artifacts_and_logs_linked_to_the_copies():
    source, target = cli_history(), FakeServer()

    report = asyncio.run(copy_runs(source, target))

    assert sorted(report.flow_runs) == ["process-deletions/turquoise-condor",
                                        "train-audit-references/educational-angelfish"]
    assert (report.task_runs, report.artifacts, report.logs, report.unfinished) == (4, 3, 250, 1)
    batch, audit = copies(target)["turquoise-condor"], copies(target)["educational-angelfish"]
    originals = {run.name: run for run in source.flow_runs.values()}
    assert batch.tags == ["deletions", COPY_TAG] and batch.parameters == {"scenario": "digits-hfl"}
    assert batch.labels[COPIED_LABEL] == str(originals["turquoise-condor"].id)
    assert [s.type for s in target.states[batch.id]] == [StateType.PENDING, StateType.RUNNING, StateType.COMPLETED]
    assert batch.state.message.startswith("All states completed. (ran 2026-11-27 07:41:00–07:42:00 UTC")
    # The subflow under its parent's copied task run; inputs point at the copies.
    placeholder = target.task_runs[audit.parent_task_run_id]
    assert placeholder.flow_run_id == batch.id and placeholder.name == "train-audit-references"
    receipt = next(task for task in target.task_runs.values() if task.name == "receipt")
    validate = next(task for task in target.task_runs.values() if task.name == "validate")
    assert receipt.task_inputs["batch"][0].id == validate.id and receipt.task_inputs["audit"][0].id == audit.id
    assert receipt.task_key == "receipt-key" and receipt.state.type == StateType.COMPLETED
    # Artifacts in the order they were made (a key's latest stays the latest), on the copies.
    assert [a.key for a in target.artifacts] == ["deletion-receipt", "deletion-batch", "deletion-status-digits-hfl"]
    assert {(a.flow_run_id, a.task_run_id) for a in target.artifacts} == {(batch.id, validate.id)}
    assert [log.timestamp for log in target.logs] == [log.timestamp for log in source.logs]
    assert {log.flow_run_id for log in target.logs} == {batch.id}


def test_a_second_copy_adds_nothing():
    source, target = cli_history(), FakeServer()
    asyncio.run(copy_runs(source, target))
    before = (len(target.flow_runs), len(target.task_runs), len(target.artifacts), len(target.logs))

    again = asyncio.run(copy_runs(source, target))

    assert (again.flow_runs, again.already, again.unfinished) == ([], 2, 1)
    assert (len(target.flow_runs), len(target.task_runs), len(target.artifacts), len(target.logs)) == before
    assert again.line() == "no new runs of the CLI to bring into the served Prefect server; 2 copied before; " \
                           "1 not finished, left for a later serve"


def test_a_run_that_finished_later_is_copied_by_the_next_serve():
    source, target = cli_history(), FakeServer()
    asyncio.run(copy_runs(source, target))
    killed = next(run for run in source.flow_runs.values() if run.name == "killed-midway")
    source.flow_runs[killed.id] = killed.model_copy(update={"state": State(type=StateType.CRASHED)})

    report = asyncio.run(copy_runs(source, target))

    assert (report.flow_runs, report.already, report.unfinished) == (["train-federated/killed-midway"], 2, 0)
    assert copies(target)["killed-midway"].state.type == StateType.CRASHED


def test_a_copy_cut_short_is_made_again_whole():
    source, target = cli_history(), FakeServer(fail_on="create_logs")
    with pytest.raises(ConnectionError):
        asyncio.run(copy_runs(source, target))
    assert len(target.flow_runs) == 2 and not any(COPIED_LABEL in run.labels for run in target.flow_runs.values())
    target.fail_on = None

    report = asyncio.run(copy_runs(source, target))

    assert report.redone == 2 and len(report.flow_runs) == 2
    assert sorted(copies(target)) == ["educational-angelfish", "turquoise-condor"]
    assert len(target.artifacts) == 3 and len(target.task_runs) == 4  # the first try's are gone


def test_a_server_that_holds_the_originals_gets_no_copies():
    both = cli_history()
    count = len(both.flow_runs)

    report = asyncio.run(copy_runs(both, both))

    assert report.same_database and report.flow_runs == [] and len(both.flow_runs) == count


def test_nothing_to_copy_where_the_served_server_opens_the_cli_database(tmp_path):
    home = tmp_path / ".prefect"
    assert shares_database(home, f"sqlite+aiosqlite:///{home}/prefect.db")
    assert shares_database(home, f"sqlite+aiosqlite:///{tmp_path}/./.prefect/prefect.db")
    assert not shares_database(home, "postgresql+asyncpg://fedunlearn@127.0.0.1:5432/prefect")
    assert not shares_database(home, f"sqlite+aiosqlite:///{tmp_path}/other.db")
    assert CopyReport(same_database=True).line().startswith("the served Prefect server uses the CLI's own database")
