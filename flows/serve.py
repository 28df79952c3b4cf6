"""Deployments: deletion batches started by request events (cron as the backstop), the other
flows on demand or weekly.

    process-deletions/deletion-batches   event triggers (below) + cron (default daily 02:00 UTC),
                                         one run at a time
    submit-deletion-requests/form        requests from the Prefect UI into the inbox
    repay-retrain-debt/weekly            exact retrain when approximate forgetting is owed; each interim
                                         batch also schedules a run at the latest safe time
    train-audit-references/audit-references   the per-example audit's reference models
    retrain-reference/exact-retrain      the gold standard of the current data version
    train-federated/new-original         a new original model
    benchmark/all-methods                every method against retraining

A batch starts (Prefect's own deployment triggers; ``runtime.events`` emits the events) when
``requests.batch_threshold`` requests of the scenario were submitted within
``requests.batch_window_hours``, at once for an urgent one (due within ``requests.urgent_hours``),
and when a submitted request was not processed within ``requests.max_wait_hours``, so no request
waits for the cron. ``fedunlearn serve`` (what ``make serve`` starts) serves them from one process
against the Prefect API in ``PREFECT_API_URL``, with the inbox watcher beside them; every flow run is
the process Prefect's runner starts for it from the flow's module path, and a concurrency limit on
the unlearning tasks' ``gpu`` tag keeps two of them off one GPU worker. The details and the reasons:
docs/serving.md, "Deployments and the two UIs".
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import TerminationSignal
from prefect.runner import Runner
from prefect.types.entrypoint import EntrypointType

from fedunlearn.config import RequestsConfig, load_params

from flows.audit import audit_references
from flows.benchmark import benchmark
from flows.debt import repay_retrain_debt
from flows.process import process_deletions
from flows.reference import retrain_reference
from flows.submit import submit_deletion_requests
from flows.train import train_federated
from runtime.events import PROCESSED, RESOURCE_PREFIX, SCENARIO_LABEL, SUBMITTED, URGENT_LABEL, InboxWatcher
from tasks.unlearning import GPU_TAG
from stores.workspace import Workspace

DEFAULT_CRON = "0 2 * * *"
DEBT_CRON = "0 3 * * 0"  # Sundays 03:00 UTC: after that night's deletion batch
BATCH_DEPLOYMENT = "deletion-batches"
# The on-demand deployments' names, each saying what a run of it does.
RETRAIN_DEPLOYMENT = "exact-retrain"
TRAIN_DEPLOYMENT = "new-original"
AUDIT_DEPLOYMENT = "audit-references"
BENCHMARK_DEPLOYMENT = "all-methods"
# The line scripts wait for before they submit requests (Prefect's own `serve` prints it too).
SERVING = "Your deployments are being served and polling for scheduled runs!"


def batch_triggers(scenario: str, requests: RequestsConfig) -> list[DeploymentEventTrigger]:
    """When request events start a deletion batch of ``scenario`` (module docstring)."""
    match = {"prefect.resource.id": f"{RESOURCE_PREFIX}*", SCENARIO_LABEL: scenario}
    return [
        DeploymentEventTrigger(
            name=f"{requests.batch_threshold} requests", description="enough requests submitted for a batch",
            expect={SUBMITTED}, match=match, posture="Reactive", threshold=requests.batch_threshold,
            within=timedelta(hours=requests.batch_window_hours)),
        DeploymentEventTrigger(
            name="urgent request", description=f"a request due within {requests.urgent_hours:g} h",
            expect={SUBMITTED}, match={**match, URGENT_LABEL: "true"}, posture="Reactive", threshold=1),
        DeploymentEventTrigger(
            name="waited too long", description=f"a request not processed {requests.max_wait_hours:g} h after "
                                                "its submission",
            after={SUBMITTED}, expect={PROCESSED}, for_each={"prefect.resource.id"}, match=match,
            posture="Proactive", threshold=1, within=timedelta(hours=requests.max_wait_hours)),
    ]


def build_deployments(root: Path, scenario: str, cron: str) -> list[tuple[Flow, dict[str, Any]]]:
    """Every served flow with its deployment's settings (``flow.to_deployment``'s arguments)."""
    common = {"root": str(root), "scenario": scenario}
    requests = load_params(root / "params.yaml").requests
    return [
        (process_deletions, dict(
            # Serving pauses it on shutdown (no runs pile up unserved); serving again resumes it.
            name=BATCH_DEPLOYMENT, cron=cron, paused=False, parameters=common, concurrency_limit=1,
            triggers=batch_triggers(scenario, requests), tags=["deletions"],
            description="Deletion batch, started by request events (enough requests, an urgent one, one waiting "
                        "too long) or the cron backstop: pending requests → new data version → unlearned, "
                        "certified, evaluated model version → gates → alias current → receipt. Run it with a "
                        "request in the form to forget it now.")),
        (submit_deletion_requests, dict(
            name="form", parameters=common, tags=["deletions"],
            description="Put deletion requests into the inbox; the batch triggers decide when they are forgotten "
                        "(process-deletions' own form forgets them at once).")),
        (retrain_reference, dict(
            name=RETRAIN_DEPLOYMENT, parameters=common, tags=["reference"],
            description="Retrain from scratch on the current data version; registers alias 'retrained'.")),
        (train_federated, dict(
            name=TRAIN_DEPLOYMENT, parameters=common, tags=["training"],
            description="Train the federated model on the current data version; registers alias 'original'.")),
        (repay_retrain_debt, dict(
            name="weekly", cron=DEBT_CRON, paused=False, parameters=common, concurrency_limit=1, tags=["reference"],
            description="Exact retrain when requests were forgotten only approximately since the last one: serves it "
                        "(alias current) and marks the receipts it covers as exactly forgotten.")),
        (audit_references, dict(
            name=AUDIT_DEPLOYMENT, parameters=common, tags=["audit"],
            description="Train the per-example audit's reference models on the held-out split (role "
                        "audit-reference); deletion batches train them when a scenario has none.")),
        (benchmark, dict(
            name=BENCHMARK_DEPLOYMENT, parameters={**common, "out": str(root / "results" / "benchmark")}, tags=["benchmark"],
            description="Every unlearning method against retraining on one request SPEC.")),
    ]


def limit_gpu_tasks(slots: int) -> None:
    """A concurrency limit on the ``gpu`` tag (created or updated) on the server in use."""
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=slots)


def serve_deployments(root: Path, scenario: str, cron: str = DEFAULT_CRON, gpu_slots: int = 1) -> None:
    """Register the deployments and run their flow runs until interrupted (Ctrl-C); meanwhile the
    inbox watcher announces every request file that arrives."""
    root = Path(root).resolve()
    limit_gpu_tasks(gpu_slots)
    ws = Workspace.open(root)
    watcher = InboxWatcher(ws.folders.inbox, scenario, ws.params.requests.deadline_days,
                           ws.params.requests.urgent_hours)
    runner = Runner(pause_on_shutdown=True)
    served = build_deployments(root, scenario, cron)
    for served_flow, settings in served:
        runner.add_deployment(served_flow.to_deployment(entrypoint_type=EntrypointType.MODULE_PATH, **settings))
    print("\n".join([SERVING, *(f"  {served_flow.name}/{settings['name']}" for served_flow, settings in served)]),
          flush=True)
    watcher.start()
    try:
        asyncio.run(runner.start())
    except (KeyboardInterrupt, TerminationSignal):
        print("stopped: the deployments are paused until served again")
    finally:
        watcher.stop()
