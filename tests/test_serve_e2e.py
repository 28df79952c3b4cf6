"""End to end as a platform team runs it: a real Prefect server (a subprocess with its own home),
the deployments served by `fedunlearn serve` (another subprocess), a deletion batch triggered
through the Prefect API as the UI's Run button does, then the registry (original, retrained and
unlearned versions, their tags and aliases), the receipt linking them, and the flow run's artifacts.
Then the event-driven path: requests submitted, announced by the inbox watcher, a batch started by
the deployment's trigger with nobody pressing Run, and `fedunlearn status` before and after.
The helpers here also start the services of the UI screenshot test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.local_server import flush_clients
from workspaces import status_row

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCENARIO = "digits-hfl"
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log: Path

    def tail(self) -> str:
        return f"--- {self.name} ({self.log}):\n" + self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """The whole process group: servers and runners start workers of their own."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


class Services:
    """Subprocesses started for one test; ``stop_all`` (a finalizer) stops every one, in reverse.
    ``prefect_database`` is the database of the Prefect server ``start_prefect`` starts (None: SQLite)."""

    def __init__(self, directory: Path, env: dict[str, str], prefect_database: str | None = None):
        self.directory, self.env, self.started = directory, env, []
        self.prefect_database = prefect_database

    def start(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Service:
        log = self.directory / f"{name}.log"
        process = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                   env={**self.env, **(extra_env or {})}, cwd=PROJECT_ROOT, start_new_session=True)
        self.started.append(Service(name, process, log))
        return self.started[-1]

    def wait_for(self, url: str, service: Service, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise RuntimeError(f"{service.name} exited with {service.process.returncode}\n{service.tail()}")
            try:
                urllib.request.urlopen(url, timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"{service.name} did not answer {url} within {timeout:.0f} s\n{service.tail()}")

    def logs(self) -> str:
        return "\n".join(service.tail() for service in self.started)

    def stop_all(self) -> None:
        for service in reversed(self.started):
            service.stop()


def start_prefect(services: Services) -> tuple[str, Service]:
    """``prefect server start`` on a free port, on ``services.prefect_database`` where there is one
    (wait until it is healthy with ``services.wait_for(api + "/health", server)``). Every later
    subprocess, and the UI the server hands to browsers, use its API URL."""
    port = free_port()
    api = services.env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    database = {"PREFECT_API_DATABASE_CONNECTION_URL": services.prefect_database} if services.prefect_database else {}
    return api, services.start("prefect-server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                                   "--port", str(port)], database)


def serve_deployments(services: Services, workspace: Path) -> Service:
    return services.start("deployments", [str(BIN / "fedunlearn"), "--root", str(workspace), "serve", "--scenario",
                                          SCENARIO, "--cron", "0 3 * * *"])


def wait_for_deployment(name: str, service: Service, timeout: float = START_TIMEOUT_S):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise RuntimeError(f"the deployments exited\n{service.tail()}")
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                time.sleep(0.5)
    raise TimeoutError(f"deployment {name} not registered within {timeout:.0f} s\n{service.tail()}")


@pytest.fixture
def services(tmp_path, request, prefect_databases) -> Services:
    home = tmp_path / "prefect-server-home"
    home.mkdir()
    # One intra-op thread per flow run: the test machine has two cores and the runs are tiny.
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "OMP_NUM_THREADS": "1"}
    started = Services(tmp_path, env, prefect_databases.new() if prefect_databases else None)
    request.addfinalizer(started.stop_all)
    request.addfinalizer(flush_clients)  # finalizers run last-in first-out: this one first
    return started


def check_batch(workspace: Path, scenario: str, receipt) -> dict:
    """The registry after a batch, as its receipt records it: every attempt registered once with its
    batch and number, the chain ending in the version that serves (it passed, the interim tier allowed
    it, or it is the exact retrain), alias
    ``current`` on that version — a version of the batch's new data version."""
    from mlflow import MlflowClient

    from stores.registry import tracking_uri

    registry = MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))
    versions = {str(v.version): v for v in registry.search_model_versions(f"name='{scenario}'")}
    for attempt in receipt.attempts:
        version = versions[attempt.version.version]
        assert version.tags["attempt"] == str(attempt.attempt) and version.tags["batch_id"] == receipt.batch_id
        assert version.tags["data_version"] == receipt.data_version_after
    # The chain ends in the version that serves: it passed, or the interim tier allowed it (the
    # batch's tier says so), or it is the exact retrain; no attempt before it could serve.
    last = receipt.attempts[-1]
    assert all(not a.passed and not (a.gates and a.gates.interim and receipt.forgetting == "interim")
               for a in receipt.attempts[:-1])
    assert last.passed or (receipt.forgetting == "interim" and last.gates.interim)
    current = registry.get_model_version_by_alias(scenario, "current")
    assert str(current.version) == receipt.attempts[-1].version.version == receipt.models["current"].version
    assert current.tags["data_version"] == receipt.data_version_after and receipt.promoted
    return versions


def test_batches_of_every_setting_run_through_the_prefect_api(workspace, services, capsys):
    """HFL (digits-hfl, PUF-Special first), VFL (wine-vfl, a class request, FedORA first) and DFL
    (breast_cancer-dfl-ring, samples at three nodes, certified DFU first), each a deployment run
    as the UI's Run button starts it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from cli import main
    from fedunlearn.data.store import load_horizontal
    from fedunlearn.receipts import read_receipt
    from flows.serve import BATCH_DEPLOYMENT
    from flows.train import train_federated

    params = workspace / "params.yaml"  # three submitted requests start a batch (phase two)
    params.write_text(params.read_text().replace("batch_threshold: 10", "batch_threshold: 3"))
    api, server = start_prefect(services)
    services.wait_for(f"{api}/health", server)
    deployments = serve_deployments(services, workspace)
    runs = {}
    with temporary_settings(updates={PREFECT_API_URL: api}):
        for scenario in (SCENARIO, "wine-vfl", "breast_cancer-dfl-ring"):  # the originals, meanwhile
            train_federated(scenario=scenario, root=str(workspace), client_tasks=False)
        ids = load_horizontal(SCENARIO, workspace).clients[2].sample_ids[:10].tolist()
        assert main(["--root", str(workspace), "request", "samples", "--scenario", SCENARIO, "--ids", *ids]) == 0
        assert main(["--root", str(workspace), "request", "class", "--scenario", "wine-vfl", "--label", "1"]) == 0
        nodes = load_horizontal("breast_cancer-dfl-ring", workspace).clients
        dfl_ids = [i for c in range(3) for i in nodes[c].sample_ids[:3].tolist()]
        assert main(["--root", str(workspace), "request", "samples", "--scenario", "breast_cancer-dfl-ring",
                     "--ids", *dfl_ids]) == 0

        deployment = wait_for_deployment(f"process-deletions/{BATCH_DEPLOYMENT}", deployments)
        schema = deployment.parameter_openapi_schema
        assert "puf-special" in schema["definitions"]["MethodChoice"]["enum"]  # the UI's form: a select
        assert {"requests", "gates", "retrain_reference", "escalation"} <= set(schema["properties"])
        assert deployment.parameters == {"root": str(workspace), "scenario": SCENARIO}
        assert deployment.schedules[0].schedule.cron == "0 3 * * *" and not deployment.paused
        # Each run is Prefect's own process, the flow imported from its module (no flow sent by value).
        assert deployment.entrypoint == "flows.process.process_deletions"

        for scenario, parameters in ((SCENARIO, {"retrain_reference": True}), ("wine-vfl", {}),
                                     ("breast_cancer-dfl-ring", {})):
            runs[scenario] = run_deployment(f"process-deletions/{BATCH_DEPLOYMENT}",
                                            parameters={"scenario": scenario, **parameters}, timeout=300,
                                            poll_interval=2)
            assert runs[scenario].state.is_completed(), f"{scenario}: {runs[scenario].state}\n{services.logs()}"
        with get_client(sync_client=True) as client:
            # The digits-hfl batch's run: ours, or (rarely) a run a deployment trigger started first —
            # then ours found nothing pending. Either way the batch's run carries the artifacts.
            batch_runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[runs[SCENARIO].deployment_id])))
            others = {runs["wine-vfl"].id, runs["breast_cancer-dfl-ring"].id}
            artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(
                any_=[r.id for r in batch_runs if r.id not in others])))
            assert client.read_concurrency_limit_by_tag("gpu").concurrency_limit == 1
    assert {(a.key, a.type) for a in artifacts} >= {("deletion-receipt", "markdown"),
                                                    ("deletion-batch-models", "table"),
                                                    ("deletion-status-digits-hfl", "markdown")}, \
        [(r.name, r.created_by and r.created_by.type, r.parameters.get("scenario")) for r in batch_runs]

    receipts = {}
    for scenario in runs:
        [path] = [p for p in (workspace / "data/receipts").glob("*.json")
                  if f'"scenario": "{scenario}"' in p.read_text()]
        receipts[scenario] = read_receipt(workspace, path.stem)
        check_batch(workspace, scenario, receipts[scenario])
    hfl = receipts[SCENARIO]
    assert hfl.forgotten_per_client == {"2": 10} and hfl.attempts[0].method == "puf-special"
    assert hfl.models["retrained"] is not None and all(a.gates.policy == "vs retrained reference"
                                                       for a in hfl.attempts if a.gates)
    vfl = receipts["wine-vfl"]
    assert vfl.attempts[0].method == "fedora" and vfl.attempts[0].version is not None
    dfl = receipts["breast_cancer-dfl-ring"]
    assert dfl.attempts[0].method == "certified-dfu" and set(dfl.forgotten_per_client) == {"0", "1", "2"}

    # Phase two, event-driven: three requests submitted, and a batch runs without anyone pressing Run
    # (the inbox watcher announces each file, the deployment's threshold trigger starts the run).
    def status() -> tuple[int, str]:
        code = main(["--root", str(workspace), "status", "--scenario", SCENARIO])
        return code, capsys.readouterr().out

    capsys.readouterr()
    ids = load_horizontal(SCENARIO, workspace).clients[1].sample_ids[:3].tolist()
    submitted = []
    for sample_id in ids:
        assert main(["--root", str(workspace), "request", "samples", "--scenario", SCENARIO, "--ids", sample_id]) == 0
        submitted.append(capsys.readouterr().out.strip())
    code, before = status()
    assert code == 0 and "3 pending request(s)" in before and all(status_row(before, r) for r in submitted)
    assert "deadline" in before.split() and "serving: v" in before
    with temporary_settings(updates={PREFECT_API_URL: api}):
        triggered = wait_for_triggered_batch(runs[SCENARIO].deployment_id, {r.id for r in batch_runs}, services)
    assert triggered.state.is_completed(), f"{triggered.state}\n{services.logs()}"
    code, after = status()
    assert code == 0 and "no pending requests" in after, after
    receipt = read_receipt(workspace, sorted((workspace / "data/receipts").glob("*.json"))[-1].stem)
    assert sorted(receipt.request_ids) == sorted(submitted)


def wait_for_triggered_batch(deployment_id, started_by_us: set, services: Services, timeout: float = 240):
    """The first run of the batch deployment that an automation (a deployment trigger) created,
    once every such run is final."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
            others = [r for r in runs if r.id not in started_by_us and r.created_by is not None
                      and r.created_by.type == "AUTOMATION"]
            if others and all(r.state.is_final() for r in others):
                return sorted(others, key=lambda r: r.created)[0]
            time.sleep(2)
    raise TimeoutError(f"no triggered deletion batch finished within {timeout:.0f} s\n{services.logs()}")
