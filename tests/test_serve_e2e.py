"""End to end as a platform team runs it: a real Prefect server (a subprocess with its own home),
the deployments served by `fedunlearn serve` (another subprocess), a deletion batch triggered
through the Prefect API as the UI's Run button does, then the registry (original, retrained and
unlearned versions, their tags and aliases), the receipt linking them, and the flow run's artifacts.
Then the event-driven path: requests submitted, announced by the inbox watcher, a batch started by
the deployment's trigger with nobody pressing Run, and `fedunlearn status` before and after.
The helpers here also start the services of the UI screenshot test.

The whole path runs once for the module (``served``, a frozen record of what the Prefect API, the
registry and the CLI said at each step); each test asserts on one part of it."""

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
from workspaces import Printed, call_cli, copy_workspace, status_row

PROJECT_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SCENARIO = "digits-hfl"
START_TIMEOUT_S = 120
pytestmark = pytest.mark.reliability  # several servers and a whole served batch: `make reliability`


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


def new_services(directory: Path, request, prefect_databases) -> Services:
    """Services started under ``directory``, all stopped when ``request``'s scope ends."""
    home = directory / "prefect-server-home"
    home.mkdir()
    # One intra-op thread per flow run: the test machine has two cores and the runs are tiny.
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "OMP_NUM_THREADS": "1"}
    started = Services(directory, env, prefect_databases.new() if prefect_databases else None)
    request.addfinalizer(started.stop_all)
    request.addfinalizer(flush_clients)  # finalizers run last-in first-out: this one first
    return started


@pytest.fixture
def services(tmp_path, request, prefect_databases) -> Services:
    return new_services(tmp_path, request, prefect_databases)


@pytest.fixture(scope="module")
def module_services(tmp_path_factory, request, prefect_databases) -> Services:
    return new_services(tmp_path_factory.mktemp("services"), request, prefect_databases)


@dataclass(frozen=True)
class Registered:
    """A scenario's registered versions (by number) and the version alias ``current`` names."""

    versions: dict
    current: object


def registered(workspace: Path, scenario: str) -> Registered:
    from mlflow import MlflowClient

    from stores.registry import tracking_uri

    registry = MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))
    versions = {str(v.version): v for v in registry.search_model_versions(f"name='{scenario}'")}
    return Registered(versions, registry.get_model_version_by_alias(scenario, "current"))


def check_batch(found: Registered, receipt) -> None:
    """The registry after a batch, as its receipt records it: every attempt registered once with its
    batch and number, the chain ending in the version that serves (every attempt before it did not
    pass), alias ``current`` on that version — a version of the batch's new data version."""
    for attempt in receipt.attempts:
        version = found.versions[attempt.version.version]
        assert version.tags["attempt"] == str(attempt.attempt) and version.tags["batch_id"] == receipt.batch_id
        assert version.tags["data_version"] == receipt.data_version_after
    assert not any(a.passed for a in receipt.attempts[:-1]) and receipt.attempts[-1].passed
    current = found.current
    assert str(current.version) == receipt.attempts[-1].version.version == receipt.models["current"].version
    assert current.tags["data_version"] == receipt.data_version_after and receipt.promoted


def cli_ok(workspace: Path, *args: str) -> Printed:
    """A CLI call that must succeed (it arranges the scenario's state)."""
    printed = call_cli(workspace, *args)
    assert printed.status == 0, printed.err
    return printed


SETTINGS = (SCENARIO, "wine-vfl", "breast_cancer-dfl-ring")


@dataclass(frozen=True)
class Served:
    """Phase one: HFL (digits-hfl, PUF-Special first), VFL (wine-vfl, a class request, FedORA first)
    and DFL (breast_cancer-dfl-ring, samples at three nodes, certified DFU first), each a deployment
    run as the UI's Run button starts it. Phase two, event-driven: three requests submitted, and a
    batch runs without anyone pressing Run. What each step left, read as it finished."""

    workspace: Path
    deployment: object                 # the batch deployment as the Prefect API read it
    runs: dict                         # scenario -> the flow run its Run started
    batch_runs: list                   # the batch deployment's runs after phase one (ours, maybe triggered ones)
    artifacts: set                     # (key, type) of the artifacts of its digits-hfl runs
    gpu_limit: int                     # the `gpu` tag's concurrency limit
    receipts: dict                     # scenario -> its batch's receipt
    registered: dict                   # scenario -> its registry right after phase one (``Registered``)
    submitted: list                    # phase two's three requests
    status_before: Printed             # `status` once they are submitted
    triggered: object                  # the first batch run a deployment trigger created
    status_after: Printed              # `status` once it finished
    last_receipt: object               # the newest receipt then
    logs: str                          # the services' logs, for failure messages


def run_phase_one(deployments: Service) -> dict:
    """Phase one, run: the deployment read, a run of it per setting, its artifacts and the gpu limit."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment

    from flows.serve import BATCH_DEPLOYMENT

    deployment = wait_for_deployment(f"process-deletions/{BATCH_DEPLOYMENT}", deployments)
    runs = {scenario: run_deployment(f"process-deletions/{BATCH_DEPLOYMENT}",
                                     parameters={"scenario": scenario, **parameters}, timeout=300, poll_interval=2)
            for scenario, parameters in zip(SETTINGS, ({"retrain_reference": True}, {}, {}))}
    with get_client(sync_client=True) as client:
        # The digits-hfl batch's run: ours, or (rarely) a run a deployment trigger started first —
        # then ours found nothing pending. Either way the batch's run carries the artifacts.
        batch_runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            id=DeploymentFilterId(any_=[runs[SCENARIO].deployment_id])))
        others = {runs["wine-vfl"].id, runs["breast_cancer-dfl-ring"].id}
        artifacts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(
            any_=[r.id for r in batch_runs if r.id not in others])))
        gpu_limit = client.read_concurrency_limit_by_tag("gpu").concurrency_limit
    return dict(deployment=deployment, runs=runs, batch_runs=batch_runs,
                artifacts={(a.key, a.type) for a in artifacts}, gpu_limit=gpu_limit)


@pytest.fixture(scope="module")
def served(fresh_workspace_template, module_services, tmp_path_factory) -> Served:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from fedunlearn.data.store import load_horizontal
    from fedunlearn.receipts import read_receipt
    from flows.train import train_federated

    # arrange
    services = module_services
    workspace = copy_workspace(fresh_workspace_template, tmp_path_factory.mktemp("served") / "workspace")
    params = workspace / "params.yaml"  # three submitted requests start a batch (phase two)
    params.write_text(params.read_text().replace("batch_threshold: 10", "batch_threshold: 3"))
    api, server = start_prefect(services)
    services.wait_for(f"{api}/health", server)
    deployments = serve_deployments(services, workspace)
    with temporary_settings(updates={PREFECT_API_URL: api}):
        for scenario in SETTINGS:  # the originals, meanwhile
            train_federated(scenario=scenario, root=str(workspace), client_tasks=False)
        ids = load_horizontal(SCENARIO, workspace).clients[2].sample_ids[:10].tolist()
        cli_ok(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids)
        cli_ok(workspace, "request", "class", "--scenario", "wine-vfl", "--label", "1")
        nodes = load_horizontal("breast_cancer-dfl-ring", workspace).clients
        dfl_ids = [i for c in range(3) for i in nodes[c].sample_ids[:3].tolist()]
        cli_ok(workspace, "request", "samples", "--scenario", "breast_cancer-dfl-ring", "--ids", *dfl_ids)

    # act: phase one (a Run per setting), the registry after it, then phase two (the trigger's batch)
    with temporary_settings(updates={PREFECT_API_URL: api}):
        phase_one = run_phase_one(deployments)
    receipts = {}
    for scenario in SETTINGS:
        [path] = [p for p in (workspace / "data/receipts").glob("*.json")
                  if f'"scenario": "{scenario}"' in p.read_text()]
        receipts[scenario] = read_receipt(workspace, path.stem)
    after_phase_one = {scenario: registered(workspace, scenario) for scenario in SETTINGS}
    ids = load_horizontal(SCENARIO, workspace).clients[1].sample_ids[:3].tolist()
    submitted = [cli_ok(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", sample_id).out.strip()
                 for sample_id in ids]
    status_before = call_cli(workspace, "status", "--scenario", SCENARIO)
    with temporary_settings(updates={PREFECT_API_URL: api}):
        triggered = wait_for_triggered_batch(phase_one["runs"][SCENARIO].deployment_id,
                                             {r.id for r in phase_one["batch_runs"]}, services)
    status_after = call_cli(workspace, "status", "--scenario", SCENARIO)
    last_receipt = read_receipt(workspace, sorted((workspace / "data/receipts").glob("*.json"))[-1].stem)
    return Served(workspace, **phase_one, receipts=receipts, registered=after_phase_one, submitted=submitted,
                  status_before=status_before, triggered=triggered, status_after=status_after,
                  last_receipt=last_receipt, logs=services.logs())


def test_the_batch_deployment_s_form_selects_a_method_and_takes_the_batch_s_options(served):
    # assert
    schema = served.deployment.parameter_openapi_schema
    assert "puf-special" in schema["definitions"]["MethodChoice"]["enum"]  # the UI's form: a select
    assert {"requests", "gates", "retrain_reference", "escalation"} <= set(schema["properties"])


def test_the_batch_deployment_runs_the_flow_of_its_module_on_its_cron_schedule(served):
    # assert
    deployment = served.deployment
    assert deployment.parameters == {"root": str(served.workspace), "scenario": SCENARIO}
    assert deployment.schedules[0].schedule.cron == "0 3 * * *" and not deployment.paused
    # Each run is Prefect's own process, the flow imported from its module (no flow sent by value).
    assert deployment.entrypoint == "flows.process.process_deletions"


@pytest.mark.parametrize("scenario", SETTINGS)
def test_batches_of_every_setting_run_through_the_prefect_api(served, scenario):
    # assert
    run = served.runs[scenario]
    assert run.state.is_completed(), f"{scenario}: {run.state}\n{served.logs}"


def test_the_batch_s_run_carries_its_receipt_its_models_and_the_status_as_artifacts(served):
    # assert
    assert served.artifacts >= {("deletion-receipt", "markdown"), ("deletion-batch-models", "table"),
                                ("deletion-status-digits-hfl", "markdown")}, \
        [(r.name, r.created_by and r.created_by.type, r.parameters.get("scenario")) for r in served.batch_runs]


def test_one_batch_at_a_time_holds_the_gpu(served):
    # assert
    assert served.gpu_limit == 1


# The version each setting's batch serves, and its tier: digits-hfl and wine-vfl escalate to the exact
# retrain (no approximate attempt passes its gates), the DFL batch's certified DFU passes at once.
SERVED_BY = {SCENARIO: ("retrain", "exact"), "wine-vfl": ("retrain", "exact"),
             "breast_cancer-dfl-ring": ("certified-dfu", "formal")}


@pytest.mark.parametrize("scenario", SETTINGS)
def test_each_batch_registers_every_attempt_and_serves_the_last_one(served, scenario):
    # assert
    receipt = served.receipts[scenario]
    assert (receipt.attempts[-1].method, receipt.forgetting) == SERVED_BY[scenario]
    check_batch(served.registered[scenario], receipt)


def test_the_served_exact_retrain_retires_in_the_same_run_every_version_that_learnt_the_batch(served):
    # assert: the original and the approximate attempts learnt the deleted samples; the batch's exact
    # retrain serves, so within the deployment's run their weights are gone and their records stay
    found, receipt = served.registered[SCENARIO], served.receipts[SCENARIO]
    learnt = [v for v in found.versions.values() if v.tags.get("role") == "original"]
    learnt += [found.versions[a.version.version] for a in receipt.attempts[:-1]]
    assert len(learnt) >= 2
    for version in learnt:
        assert (version.tags.get("retirement"), version.tags.get("retired_by")) == ("retired", receipt.batch_id)
        assert version.tags.get("weights_sha256")
    assert found.current.tags.get("retirement") is None


def test_the_hfl_batch_starts_with_puf_special_gated_against_its_retrained_reference(served):
    # assert
    hfl = served.receipts[SCENARIO]
    *approximate, exact = hfl.attempts
    assert hfl.forgotten_per_client == {"2": 10} and hfl.attempts[0].method == "puf-special"
    assert hfl.models["retrained"] is not None
    assert all(a.gates.policy == "vs retrained reference" for a in approximate) and exact.gates is None


def test_the_vfl_batch_starts_with_fedora(served):
    # assert
    vfl = served.receipts["wine-vfl"]
    assert vfl.attempts[0].method == "fedora" and vfl.attempts[0].version is not None


def test_the_dfl_batch_starts_with_certified_dfu_and_forgets_at_the_three_nodes(served):
    # assert
    dfl = served.receipts["breast_cancer-dfl-ring"]
    assert dfl.attempts[0].method == "certified-dfu" and set(dfl.forgotten_per_client) == {"0", "1", "2"}


def test_submitted_requests_are_pending_in_status_with_their_deadline_and_the_serving_version(served):
    # assert
    before = served.status_before
    assert before.status == 0 and "3 pending request(s)" in before.out, before.err
    assert all(status_row(before.out, r) for r in served.submitted)
    assert "deadline" in before.out.split() and "serving: v" in before.out


def test_the_deployment_s_trigger_runs_the_batch_of_the_submitted_requests_with_nobody_pressing_run(served):
    """The inbox watcher announces each file, the deployment's threshold trigger starts the run."""
    # assert
    assert served.triggered.state.is_completed(), f"{served.triggered.state}\n{served.logs}"
    assert sorted(served.last_receipt.request_ids) == sorted(served.submitted)


def test_after_the_triggered_batch_status_finds_nothing_pending(served):
    # assert
    after = served.status_after
    assert after.status == 0 and "no pending requests" in after.out, after.out


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
