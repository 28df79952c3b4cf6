"""Flow ``train-audit-references``: the reference models of a scenario's per-example forgetting
audit, trained once on the held-out split (never production training data: no deletion of
training data ever invalidates them, and they hold no deleted training sample) and registered as a
version of ``<scenario>-audit`` with role ``audit-reference``.

    DVC stages (current data version) ─▶ held-out split ─▶ K references on seeded subsets of its
    pool A (params.yaml ``audit``) ─▶ registered: weights + the IDs they were built from

``process-deletions`` runs it when a scenario has no usable set (none yet, or requests deleted
held-out rows that too many references trained on); deployed on its own it refreshes the set.
"""

from __future__ import annotations

import torch
from prefect import flow

from flows.results import AuditReferencesResult
from tasks.audit import ROLE, audit_model, register_audit_set, train_audit_models
from tasks.data import command_device, load_data, reproduce_data
from tasks.models import log_data_version
from stores.workspace import ScenarioScope, Workspace


@flow(name="train-audit-references", log_prints=True)
def audit_references(scenario: str = "mnist5k-hfl", root: str = ".",
                     device: str | None = None) -> AuditReferencesResult:
    """Train and register ``scenario``'s audit reference models on its current held-out split.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        root: the workspace (the directory holding params.yaml).
        device: auto, cpu, cuda or mps; empty: params.yaml's ``device``.
    """
    ws = Workspace.open(root)
    scope = ScenarioScope(ws, scenario)
    return train_audit_set(scope, command_device(ws, device), reproduce_data(ws, scenario))


def train_audit_set(scope: ScenarioScope, device: torch.device, data_version: str) -> AuditReferencesResult:
    """``scope``'s audit references trained on the held-out split of ``data_version`` (the current
    one, which the caller holds) and registered; each step a task run of the caller's flow."""
    ws, scenario = scope.ws, scope.scenario
    federation = load_data(ws, scenario, device)
    references = train_audit_models(ws, federation)
    version = register_audit_set(ws, scenario, references, data_version)
    # Its data: the held-out split of this data version (the lineage every version's run records).
    log_data_version(ws, ws.registry.version(audit_model(scenario), version).run_id, scenario, data_version, ROLE)
    print(f"{len(references)} audit references of {scenario} on {len(federation.test)} held-out samples in "
          f"{references.seconds:.1f} s: {scenario}-audit v{version}")
    return AuditReferencesResult(scenario=scenario, version=version, references=len(references),
                                 seconds=references.seconds)
