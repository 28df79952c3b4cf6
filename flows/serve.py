"""Deployments: the recurring deletion batch on a cron schedule, the other flows on demand.

    process-deletions/deletion-batches   cron (default daily 02:00 UTC), one run at a time
    retrain-reference/on-demand          the gold standard of the current data version
    train-federated/on-demand            a new original model
    benchmark/on-demand                  every method against retraining

``fedunlearn serve`` (what ``make serve`` starts) serves them from one process against the
Prefect API in ``PREFECT_API_URL``; each flow run starts as a subprocess. Their parameters are
typed (pydantic models and enums), so the Prefect UI's Run button shows forms; ``root`` defaults
to the served workspace.

GPU: the unlearning tasks carry the tag ``gpu`` (``tasks.benchmark``: unlearn, train-original,
audit-ulira); serving first sets a concurrency limit on that tag (one slot by default), so runs
started together never put two of them on one GPU worker — the second waits for the slot.
"""

from __future__ import annotations

from pathlib import Path

from prefect import serve
from prefect.client.orchestration import get_client

from flows.audit import audit_references
from flows.benchmark import benchmark
from flows.debt import repay_retrain_debt
from flows.process import process_deletions
from flows.reference import retrain_reference
from flows.train import train_federated
from tasks.unlearning import GPU_TAG

DEFAULT_CRON = "0 2 * * *"
DEBT_CRON = "0 3 * * 0"  # Sundays 03:00 UTC: after that night's deletion batch
BATCH_DEPLOYMENT = "deletion-batches"
ON_DEMAND = "on-demand"


def build_deployments(root: Path, scenario: str, cron: str) -> list:
    common = {"root": str(root), "scenario": scenario}
    return [
        process_deletions.to_deployment(
            # Serving pauses it on shutdown (no runs pile up unserved); serving again resumes it.
            name=BATCH_DEPLOYMENT, cron=cron, paused=False, parameters=common, concurrency_limit=1,
            tags=["deletions"],
            description="Recurring deletion batch: pending requests → new data version → unlearned, certified, "
                        "evaluated model version → gates → alias current → receipt. Run it with a request in the "
                        "form to forget it now."),
        retrain_reference.to_deployment(
            name=ON_DEMAND, parameters=common, tags=["reference"],
            description="Retrain from scratch on the current data version; registers alias 'retrained'."),
        train_federated.to_deployment(
            name=ON_DEMAND, parameters=common, tags=["training"],
            description="Train the federated model on the current data version; registers alias 'original'."),
        repay_retrain_debt.to_deployment(
            name="weekly", cron=DEBT_CRON, paused=False, parameters=common, concurrency_limit=1, tags=["reference"],
            description="Exact retrain when requests were forgotten only approximately since the last one: serves it "
                        "(alias current) and marks the receipts it covers as exactly forgotten."),
        audit_references.to_deployment(
            name=ON_DEMAND, parameters=common, tags=["audit"],
            description="Train the per-example audit's reference models on the held-out split (role "
                        "audit-reference); deletion batches train them when a scenario has none."),
        benchmark.to_deployment(
            name=ON_DEMAND, parameters={**common, "out": str(root / "results" / "benchmark")}, tags=["benchmark"],
            description="Every unlearning method against retraining on one request SPEC."),
    ]


def limit_gpu_tasks(slots: int) -> None:
    """A concurrency limit on the ``gpu`` tag (created or updated) on the server in use."""
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=slots)


def serve_deployments(root: Path, scenario: str, cron: str = DEFAULT_CRON, gpu_slots: int = 1) -> None:
    """Register the deployments and run their flow runs until interrupted (Ctrl-C)."""
    limit_gpu_tasks(gpu_slots)
    serve(*build_deployments(Path(root).resolve(), scenario, cron))
