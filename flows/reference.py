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

from flows.heartbeat import parent_heartbeat
from flows.train import train_federated
from tasks.data import reproduce_data
from tasks.workspace import Workspace


@flow(name="retrain-reference", log_prints=True)
def retrain_reference(scenario: str = "mnist5k-hfl", root: str = ".", device: str | None = None,
                      batch_id: str | None = None) -> dict:
    """Retrain ``scenario`` from scratch on its current data version and register the result with
    alias ``retrained``; a data version that already has its reference keeps it (retraining is
    deterministic for a seed, so a second one would be the same model)."""
    ws = Workspace.open(root)
    data_version = reproduce_data(ws, scenario)
    existing = ws.registry.versions(scenario, role="retrained", data_version=data_version)
    if existing:
        version = str(existing[-1].version)
        ws.registry.set_alias(scenario, "retrained", version)
        print(f"data version {data_version} already has its reference: {scenario} v{version}")
        return {"scenario": scenario, "data_version": data_version, "model_version": version, "reused": True}
    with parent_heartbeat():
        result = train_federated(scenario=scenario, root=str(ws.root), device=device, role="retrained",
                                 batch_id=batch_id)
    return {**result, "reused": False}
