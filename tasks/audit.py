"""Prefect tasks of the per-example forgetting audit (``fedunlearn.evaluation.audit``): the
reference models of a scenario, registered once as a version of ``<scenario>-audit`` with role
``audit-reference`` (each reference's weights and the held-out IDs it was built from), read back
for every batch, retired when a request deletes a held-out row they trained on; and the audit of a
model version, with its per-sample scores and plot as artifacts of the version's run."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from fedunlearn.certify.gates import GateOutcome
from fedunlearn.evaluation.audit import (AuditResult, AuditSet, audit_forgetting, plot_audit,
                                         restore_references, train_audit_set)
from fedunlearn.federation.local import Tensors
from fedunlearn.federation.protocol import Federation
from fedunlearn.timing import CORE, core_compute
from runtime import progress
from stores.workspace import Workspace

ROLE = "audit-reference"
DESCRIPTION = "references.json"


def audit_model(scenario: str) -> str:
    """The registered model holding a scenario's reference sets (apart from its own versions)."""
    return f"{scenario}-audit"


def fresh_model(federation: Federation) -> nn.Module:
    """An untrained model of the scenario over full features, seeded by the caller."""
    return federation.model_from(federation.engine().initial_state())


@task(name="train-audit-references", cache_policy=NO_CACHE)
@core_compute
def train_audit_models(ws: Workspace, federation: Federation) -> AuditSet:
    return train_audit_set(federation.test, lambda: fresh_model(federation), config=ws.params.audit,
                            seed=ws.params.seed, on_reference=lambda k, n: progress.report(
                                "audit references", k, n, f"reference {k}/{n} trained "
                                f"({ws.params.audit.epochs} epochs on held-out samples)"))


@task(name="register-audit-references", cache_policy=NO_CACHE)
def register_audit_set(ws: Workspace, scenario: str, references: AuditSet, data_version: str) -> str:
    """One version of ``<scenario>-audit``: every reference's weights and the IDs it was built from
    (held-out sample IDs: identifiers, never rows)."""
    registry = ws.registry
    with registry.run(f"{scenario}-audit", "audit references", ws.params.audit.model_dump(),
                      {"role": ROLE, "scenario": scenario}) as run_id:
        registry.log_metrics(run_id, {"training_seconds": references.seconds, "references": len(references)})
        description = {"train_ids": [ids.tolist() for ids in references.train_ids],
                       "pool_a_ids": references.pool_a_ids.tolist(), "pool_ids": references.pool.sample_ids.tolist()}
        with tempfile.TemporaryDirectory(dir=ws.temporary_dir) as tmp:
            for k, model in enumerate(references.models):
                state = {key: value.detach().cpu() for key, value in model.state_dict().items()}
                torch.save(state, Path(tmp) / f"reference_{k}.pt")
            (Path(tmp) / DESCRIPTION).write_text(json.dumps(description))
            registry.client.log_artifacts(run_id, tmp, "references")
        return registry.create_version(audit_model(scenario), run_id, "references",
                                       {"role": ROLE, "scenario": scenario, "data_version": data_version,
                                        "references": str(len(references))})


@task(name="load-audit-references", cache_policy=NO_CACHE)
def load_audit_set(ws: Workspace, scenario: str, federation: Federation, deleted: set[str]) -> AuditSet | None:
    """The scenario's latest reference set against ``federation``'s held-out split, without the
    references that trained on rows deleted since or by this batch (``deleted``), which also leave
    its pool (None: none registered, or too few references left)."""
    versions = ws.registry.versions(audit_model(scenario), role=ROLE)
    if not versions:
        return None
    version = versions[-1]
    with tempfile.TemporaryDirectory(dir=ws.temporary_dir) as tmp:
        local = Path(ws.registry.client.download_artifacts(version.run_id, "references", tmp))
        description = json.loads((local / DESCRIPTION).read_text())
        models = []
        for k in range(len(description["train_ids"])):
            model = fresh_model(federation)
            model.load_state_dict(torch.load(local / f"reference_{k}.pt", map_location="cpu", weights_only=True))
            models.append(model.to(federation.device))
    with CORE.measure():  # the references' scores on the pool: the audit's compute, as when they were trained
        references = restore_references(models, [np.asarray(ids) for ids in description["train_ids"]],
                                        np.asarray(description["pool_a_ids"]), federation.test,
                                        np.asarray(description["pool_ids"]), ws.params.audit)
    held_out = set(np.concatenate([references.pool_a_ids, np.asarray(description["pool_ids"])]).tolist())
    gone = (held_out - set(federation.test.sample_ids.tolist())) | (held_out & deleted)
    if not gone:
        return references
    try:
        return references.without(sorted(gone))
    except ValueError:  # too many references saw deleted rows: the flow trains a new set
        return None


@task(name="audit-forgetting", cache_policy=NO_CACHE, task_run_name="audit-{name}")
@core_compute
def audit(name: str, model: nn.Module, forget: Tensors, references: AuditSet, seed: int,
          clean_forget_labels: np.ndarray | None = None) -> AuditResult:
    return audit_forgetting(model, forget, references, seed=seed, clean_forget_labels=clean_forget_labels)


def log_audit(ws: Workspace, run_id: str, result: AuditResult) -> None:
    """The verdict as metrics, the per-sample scores (sample IDs, z, p) and the plot as artifacts."""
    ws.registry.log_metrics(run_id, {"audit_auc": result.auc, "audit_auc_low": result.interval[0],
                                     "audit_auc_high": result.interval[1]})
    ws.registry.set_run_tag(run_id, "audit_verdict", result.verdict)
    ws.registry.log_text(run_id, result.to_json(), "audit/audit.json")
    with tempfile.TemporaryDirectory(dir=ws.temporary_dir) as tmp:
        ws.registry.log_artifact(run_id, plot_audit(result, Path(tmp) / "audit.png"), "audit")


def log_source_audit(ws: Workspace, run_id: str, batch_id: str, result: AuditResult, gates: GateOutcome) -> None:
    """The source model's audit and checks for a batch, in the source version's run beside the
    candidates' (one file per batch: a source serves many batches)."""
    document = {"batch_id": batch_id, "audit": json.loads(result.to_json()), "gates": gates.model_dump(mode="json")}
    ws.registry.log_text(run_id, json.dumps(document, indent=2), f"batches/{batch_id}/source_audit.json")
