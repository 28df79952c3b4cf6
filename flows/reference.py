"""Flow ``retrain-reference``: the gold standard for the current data version.

    DVC stages (current data version) ─▶ already a reference for it? reuse
    ─▶ train-federated from scratch on it ─▶ registered version: role=retrained, alias ``retrained``

Unlearned versions are judged against it (``process-deletions`` gates), and it is the last step
of every escalation. ``process-deletions`` runs it after a batch (``retrain_reference=True``, the
version is tagged with the batch); deployed on its own it refreshes the reference on demand or on a
schedule.
"""

from __future__ import annotations

from prefect import flow

from flows.forget_sets import measure_retrained, retrain_device
from flows.heartbeat import parent_heartbeat
from flows.results import ReferenceResult
from flows.train import train_federated
from tasks.data import command_device, reproduce_data
from tasks.debt import close_by_retrain, open_batches
from tasks.models import move_alias
from stores.workspace import Workspace


# Closing batches waits for a deletion batch that holds the workspace's lock, as batches wait for each other.
LOCK_TIMEOUT_S = 1800.0


@flow(name="retrain-reference", log_prints=True)
def retrain_reference(scenario: str = "mnist5k-hfl", root: str = ".", device: str | None = None,
                      batch_id: str | None = None, close_open: bool = True) -> ReferenceResult:
    """Retrain ``scenario`` from scratch on its current data version and register the result with
    alias ``retrained``; a data version that already has its reference keeps it (retraining is
    deterministic for a seed, so a second one would be the same model). Batches applied without
    unlearning (``fedunlearn ingest``) leave ``current`` on a model of their deleted samples: with
    ``close_open`` (and outside a batch) the retrain serves instead and each gets its receipt.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        root: the workspace (the directory holding params.yaml).
        device: auto, cpu, cuda or mps; empty: params.yaml's ``device``.
        batch_id: the deletion batch this retrain is the reference for; empty outside a batch.
        close_open: let the retrain serve (alias current) and close batches applied without unlearning.
    """
    ws = Workspace.open(root)
    data_version = reproduce_data(ws, scenario)
    existing = ws.registry.versions(scenario, role="retrained", data_version=data_version)
    if existing:
        version = str(existing[-1].version)
        move_alias(ws, scenario, "retrained", version)
        print(f"data version {data_version} already has its reference: {scenario} v{version}")
        result = ReferenceResult(scenario=scenario, data_version=data_version, model_version=version, reused=True)
    else:
        with parent_heartbeat():
            trained = train_federated(scenario=scenario, root=str(ws.root), device=device, role="retrained",
                                      batch_id=batch_id)
            result = ReferenceResult.of_training(trained)
    if close_open and batch_id is None and open_batches(ws, scenario):
        with ws.batch_lock(LOCK_TIMEOUT_S, f"fedunlearn retrain --scenario {scenario}"):
            # Asked again under the lock: a batch that held it meanwhile moved the data, or finished (and
            # chose what serves) the batch it found open. Then this retrain is a reference, nothing more.
            if ws.data_version(scenario) == result.data_version and open_batches(ws, scenario):
                closed = close_by_retrain(ws, scenario, ws.registry.alias_ref(scenario, "retrained"),
                                          "retrain-reference")
                result = result.model_copy(update={"closed": closed})
                measure_retrained(ws, scenario, result.model_version, closed,
                                  retrain_device(result) or command_device(ws, device))
                print(f"alias current -> {scenario} v{result.model_version}: it closes the batch(es) applied "
                      f"without unlearning {', '.join(closed)} (receipts written)")
    return result
