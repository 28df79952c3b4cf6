"""Flow ``retrain-reference``: the gold standard for the current data version.

    DVC stages (current data version) ─▶ already a reference for it? reuse
    ─▶ train-federated from scratch on it ─▶ registered version: role=retrained, alias ``retrained``

Unlearned versions are judged against it (``process-deletions`` gates), and it is the last step
of every escalation. ``process-deletions`` runs it after a batch (``retrain_reference=True``, the
version is tagged with the batch); deployed on its own it refreshes the reference on demand or on a
schedule.
"""

from __future__ import annotations

import torch
from prefect import flow

from fedunlearn.retrain_debt import reference_to_reuse, retrain_closes_open
from fedunlearn.device import intra_op_threads
from flows.forget_sets import measure_retrained, retrain_device
from flows.results import ReferenceResult
from flows.train import Training, train_model
from tasks.data import command_device, reproduce_data
from tasks.debt import close_by_retrain, open_batches
from tasks.models import move_alias
from stores.workspace import ScenarioScope, Workspace


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
    scope, chosen = ScenarioScope(ws, scenario), command_device(ws, device)
    with intra_op_threads(scope.config.threads):
        result = reference_for(scope, chosen, reproduce_data(ws, scenario), batch_id)
        if close_open and batch_id is None and open_batches(ws, scenario):
            result = close_open_batches(scope, result, chosen)
    return result


def reference_for(scope: ScenarioScope, device: torch.device, data_version: str,
                  batch_id: str | None = None) -> ReferenceResult:
    """The reference of ``data_version`` (the current one, which the caller holds): the one it already
    has (``retrain_debt.reference_to_reuse``), else an exact retrain on ``device``, tagged with
    ``batch_id`` when a deletion batch asked for it."""
    ws, scenario = scope.ws, scope.scenario
    existing = ws.registry.versions(scenario, role="retrained", data_version=data_version)
    version = reference_to_reuse([str(v.version) for v in existing])
    if version is None:
        return ReferenceResult.of_training(train_model(scope, device, data_version,
                                                       Training(role="retrained", batch_id=batch_id)))
    move_alias(ws, scenario, "retrained", version)
    print(f"data version {data_version} already has its reference: {scenario} v{version}")
    return ReferenceResult(scenario=scenario, data_version=data_version, model_version=version, reused=True)


def close_open_batches(scope: ScenarioScope, result: ReferenceResult, device: torch.device) -> ReferenceResult:
    """The retrain serves and closes the batches applied without unlearning, under the batch lock."""
    ws, scenario = scope.ws, scope.scenario
    with ws.batch_lock(LOCK_TIMEOUT_S, f"fedunlearn retrain --scenario {scenario}"):
        # Asked again under the lock: a batch that held it meanwhile moved the data, or finished (and
        # chose what serves) the batch it found open. Then this retrain is a reference, nothing more.
        still_open = open_batches(ws, scenario)
        if not retrain_closes_open(result.data_version, ws.data_version(scenario), len(still_open)):
            return result
        closed = [r.batch_id for r in close_by_retrain(ws, scenario, ws.registry.alias_ref(scenario, "retrained"),
                                                       "retrain-reference", still_open)]
        measure_retrained(scope, result.model_version, still_open, retrain_device(result) or device)
        print(f"alias current -> {scenario} v{result.model_version}: it closes the batch(es) applied without "
              f"unlearning {', '.join(closed)} (receipts written)")
        return result.model_copy(update={"closed": closed})
