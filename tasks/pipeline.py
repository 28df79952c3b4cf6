"""Prefect tasks of the deletion pipeline (``process-deletions``, ``retrain-reference``): thin
steps over the benchmark core (evaluation sets, methods, rows), the ingest data plane, the MLflow
registry (``tasks.tracking``) and the receipts (``fedunlearn.receipts``).

Registry conventions: every version of the registered model ``<scenario>`` carries the tags
``role`` (original | retrained | unlearned), ``scenario``, ``data_version`` and ``certificate``
(its guarantee class); unlearned and batch-triggered retrained versions also ``batch_id``,
unlearned ones ``method`` and ``source_version``. Aliases: ``original`` (the trained model),
``retrained`` (the latest exact reference), ``current`` (the version that serves: moved only
when an unlearned version passes its gates).
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import Field

from fedunlearn.benchmark import runner
from fedunlearn.benchmark.settings import load_federation
from fedunlearn.benchmark.spec import RequestSpec
from fedunlearn.certify.certificate import GUARANTEES, NOT_CERTIFIED, Certificate, Gates, evaluate_gates
from fedunlearn.config import Params
from fedunlearn.errors import BatchCannotSucceed
from fedunlearn.evaluation.cost import CostRecord
from fedunlearn.federation.local import Tensors
from fedunlearn.receipts import VERSION_METRICS, GateCheck, GateOutcome, ModelRef, Receipt, read_receipt
from fedunlearn.receipts import write_receipt as write_receipt_file
from fedunlearn.requests.batch import BatchRecord, BatchStatus, load_records
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.ledger import LedgerEntry
from fedunlearn.unlearning import DeletionBatch
from fedunlearn.unlearning.base import Outcome
from tasks import tracking, workspace
from tasks.timing import core_compute

SOURCE_ALIASES = ("current", "retrained", "original")

Guarantee = Enum("Guarantee", {g: g for g in GUARANTEES}, type=str)


# --- Data: the batch's data version and its forget set -----------------------------------------

@task(name="load-data-version", cache_policy=NO_CACHE)
@core_compute
def load_data_version(root: Path, scenario: str, params: Params, device: torch.device, data_version: str):
    """The federation of ``data_version`` with the samples a batch deletes still in it: the
    workspace's files while they are that version (a fresh batch, before its ledger append),
    afterwards DVC's cache (a batch resumed after a crash, or ingested by `fedunlearn ingest`).
    Read into memory only."""
    if workspace.data_version(root, scenario) == data_version:
        return load_federation(scenario, params, root, device)
    with tempfile.TemporaryDirectory(prefix="fedunlearn-version-", dir=workspace.temporary_dir(root)) as tmp:
        workspace.checkout_from_cache(root, scenario, data_version, Path(tmp))
        return load_federation(scenario, params, Path(tmp), device)


@dataclass(frozen=True)
class BatchSpec(RequestSpec):
    """A ledger batch, already resolved to sample IDs per client: the benchmark's setup (evaluation
    sets, non-members matched to the forget set's labels) is built from it unchanged."""

    batch: DeletionBatch | None = None

    def resolve(self, clients, num_classes: int, seed: int) -> DeletionBatch:
        return self.batch


def deletion_batch(batch_id: str, entries: list[LedgerEntry], clients: list[Tensors]) -> DeletionBatch:
    """The training samples the batch's requests delete, per client index. Held-out test samples
    were never trained on, so there is nothing to unlearn for them. The batch keeps its requests'
    kind when they share one (methods treat whole clients and classes specially), else ``sample``."""
    kinds = {entry.kind.value if entry.kind else "sample" for entry in entries}
    kind = kinds.pop() if len(kinds) == 1 else "sample"
    held_out = {i for entry in entries for i in entry.held_out}
    trained = [i for entry in entries for i in entry.sample_ids if i not in held_out]
    if not trained:
        raise ValueError(f"batch {batch_id} deletes only held-out test samples, which no model was trained on; "
                         "apply it with `fedunlearn ingest` and register a model for the new data version with "
                         "`fedunlearn retrain`")
    located = DeletionBatch.for_sample_ids(trained, clients, batch_id=batch_id)
    labels = sorted({e.subject["label"] for e in entries}) if kind == "class" else None
    return DeletionBatch(kind, located.forget_ids, clients=located.affected_clients if kind == "client" else None,
                         labels=labels, batch_id=batch_id)


@task(name="prepare-batch", cache_policy=NO_CACHE)
@core_compute
def prepare_batch(scenario: str, fed_state: Any, batch_id: str, entries: list[LedgerEntry]) -> runner.BenchmarkSetup:
    """The forget set per client and the evaluation sets, from the data before the batch."""
    batch = deletion_batch(batch_id, entries, fed_state.clients)
    spec = BatchSpec(f"batch {batch_id}", batch.kind, [e.request_id for e in entries], batch)
    return runner.build_setup(scenario, fed_state, spec)


# --- Registry -----------------------------------------------------------------------------------

@dataclass
class LoadedModel:
    ref: ModelRef
    state: dict[str, torch.Tensor]
    metrics: dict[str, float]  # the latest value of each metric of its run


def version_ref(version) -> ModelRef:
    return ModelRef(version=str(version.version), role=version.tags.get("role", "?"),
                    data_version=version.tags.get("data_version"), run_id=version.run_id)


def by_alias(root: Path, scenario: str, alias: str):
    """The model version behind ``scenario@alias``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return tracking.use_store(root).get_model_version_by_alias(scenario, alias)
    except MlflowException:
        return None


def alias_ref(root: Path, scenario: str, alias: str) -> ModelRef | None:
    version = by_alias(root, scenario, alias)
    return version_ref(version) if version is not None else None


def model_at(root: Path, scenario: str, data_version: str, aliases: tuple[str, ...]) -> LoadedModel | None:
    """The first of ``aliases`` whose version was trained or unlearned on ``data_version``."""
    for alias in aliases:
        version = by_alias(root, scenario, alias)
        if version is not None and version.tags.get("data_version") == data_version:
            state, _ = tracking.load_weights(root, scenario, alias)
            metrics = tracking.use_store(root).get_run(version.run_id).data.metrics
            return LoadedModel(version_ref(version), state, metrics)
    return None


def load_version(root: Path, scenario: str, version: str) -> LoadedModel:
    found = tracking.use_store(root).get_model_version(scenario, version)
    state, _ = tracking.load_weights(root, scenario, version=version)
    return LoadedModel(version_ref(found), state, tracking.use_store(root).get_run(found.run_id).data.metrics)


@task(name="load-source-model", cache_policy=NO_CACHE)
def load_source_model(root: Path, scenario: str, data_version: str,
                      registered: ModelRef | None = None) -> LoadedModel:
    """The version to unlearn from: it must know exactly the data before the batch, so the first
    of the aliases current, retrained, original on that data version — or, for a batch whose
    unlearned version is ``registered`` already (a run killed after registering, perhaps after
    moving ``current`` to it), the source that version records."""
    if registered is not None:
        source = tracking.use_store(root).get_model_version(scenario, registered.version).tags["source_version"]
        return load_version(root, scenario, source)
    found = model_at(root, scenario, data_version, SOURCE_ALIASES)
    if found is None:
        seen = {alias: (v.version, v.tags.get("data_version")) for alias in SOURCE_ALIASES
                if (v := by_alias(root, scenario, alias)) is not None}
        listing = ", ".join(f"{a}=v{n} (data version {d})" for a, (n, d) in seen.items()) or "none registered"
        raise ValueError(f"no registered version of {scenario} under the aliases {', '.join(SOURCE_ALIASES)} was "
                         f"trained on data version {data_version} ({listing}), so none can be unlearned from; "
                         f"train one with `fedunlearn train --scenario {scenario}` (no version yet) or "
                         f"`fedunlearn retrain --scenario {scenario}` (the data moved on), or review an unlearned "
                         "version that failed its gates and set its alias 'current' in MLflow")
    return found


@task(name="find-reference", cache_policy=NO_CACHE)
def find_reference(root: Path, scenario: str, data_version: str) -> LoadedModel | None:
    """The retrained reference (alias ``retrained``) of ``data_version``, if one is registered."""
    return model_at(root, scenario, data_version, ("retrained",))


def measured(row: dict[str, Any], key: str) -> float:
    """``row[key]`` as a float; NaN (never a gap) where nothing was measured."""
    return math.nan if row.get(key) is None else float(row[key])


def version_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The metric keys every version's run carries."""
    return {key: measured(row, key) for key in VERSION_METRICS}


@task(name="find-registered-version", cache_policy=NO_CACHE)
def registered_for_batch(root: Path, scenario: str, role: str, batch_id: str) -> ModelRef | None:
    versions = tracking.use_store(root).search_model_versions(
        f"name='{scenario}' and tags.batch_id='{batch_id}' and tags.role='{role}'")
    return version_ref(versions[0]) if versions else None


@task(name="register-version", cache_policy=NO_CACHE)
def register_version(root: Path, scenario: str, model: torch.nn.Module, input_shape: tuple[int, ...],
                     tags: dict[str, str], params: dict[str, Any], metrics: dict[str, float],
                     texts: dict[str, str]) -> ModelRef:
    """A run with the version metrics and ``texts`` as artifacts, then a new registered version
    with ``tags``. Once per batch and role: a re-run of the batch gets the version registered before."""
    existing = registered_for_batch(root, scenario, tags["role"], tags["batch_id"])
    if existing is not None:
        get_run_logger().info("batch %s already registered %s version %s", tags["batch_id"], tags["role"],
                              existing.version)
        return existing
    run_id = tracking.start_run(root, scenario, f"{tags['role']}-{tags['batch_id']}", params, tags)
    tracking.log_metrics(root, run_id, metrics)
    client = tracking.use_store(root)
    for name, text in texts.items():
        client.log_text(run_id, text, name)
    version = tracking.register_model(root, run_id, model, input_shape, scenario, tags, alias=None)
    tracking.end_run(root, run_id)
    return ModelRef(version=version, role=tags["role"], data_version=tags["data_version"], run_id=run_id)


@task(name="load-registered-outcome", cache_policy=NO_CACHE)
def registered_outcome(root: Path, scenario: str, ref: ModelRef) -> tuple[Outcome, Certificate]:
    """The outcome of a batch's unlearning as it was registered before a crash: its weights, its
    run's cost metrics and its certificate.json. A resumed batch reports this model, not a new
    one (a method with fresh noise would otherwise be evaluated on weights nobody registered)."""
    client = tracking.use_store(root)
    state, _ = tracking.load_weights(root, scenario, version=ref.version)
    metrics = client.get_run(ref.run_id).data.metrics
    with tempfile.TemporaryDirectory() as tmp:
        certificate = Certificate.from_json(Path(client.download_artifacts(ref.run_id, "certificate.json",
                                                                           tmp)).read_text())
    cost = CostRecord(metrics.get("wall_seconds", math.nan), metrics.get("flops", math.nan),
                      int(metrics.get("comm_bytes", 0)))
    return Outcome(state, cost, notes={"resumed": f"registered as v{ref.version} before the run was interrupted"}), \
        certificate


@task(name="log-reference-metrics", cache_policy=NO_CACHE)
def log_reference_metrics(root: Path, run_id: str, row: dict[str, Any]) -> None:
    """The reference's forget accuracy and MIA AUC on this batch's forget set (its training run
    could not know the forget set, and logged NaN)."""
    tracking.log_metrics(root, run_id, {key: version_metrics(row)[key] for key in ("forget_acc", "mia_auc")})


@task(name="move-alias", cache_policy=NO_CACHE)
def move_alias(root: Path, scenario: str, alias: str, version: str) -> None:
    tracking.use_store(root).set_registered_model_alias(scenario, alias, version)


@task(name="remove-alias", cache_policy=NO_CACHE)
def remove_alias(root: Path, scenario: str, alias: str) -> None:
    if by_alias(root, scenario, alias) is not None:
        tracking.use_store(root).delete_registered_model_alias(scenario, alias)


def finite(value: float | None) -> float | None:
    """None for a metric nobody measured (NaN): JSON and Prefect tables have no NaN."""
    return None if value is None or math.isnan(value) else value


def registry_table(root: Path, scenario: str) -> list[dict[str, Any]]:
    """Every registered version of ``scenario``, oldest first: aliases, tags and the version
    metrics of its run — what ``fedunlearn compare`` prints."""
    from mlflow.exceptions import MlflowException

    client = tracking.use_store(root)
    try:
        aliases = client.get_registered_model(scenario).aliases  # search results leave aliases out
    except MlflowException:
        raise ValueError(f"no registered model {scenario!r} in {tracking.tracking_uri(root)}: train it with "
                         f"`fedunlearn train --scenario {scenario}`") from None
    rows = []
    for version in sorted(client.search_model_versions(f"name='{scenario}'"), key=lambda v: int(v.version)):
        metrics = client.get_run(version.run_id).data.metrics
        rows.append({"version": int(version.version),
                     "aliases": ",".join(a for a, n in sorted(aliases.items()) if str(n) == str(version.version)),
                     "role": version.tags.get("role"), "method": version.tags.get("method", "fedavg"),
                     "data_version": (version.tags.get("data_version") or "")[:10],
                     "batch_id": version.tags.get("batch_id"),
                     **{key: finite(metrics.get(key)) for key in VERSION_METRICS},
                     "certificate": version.tags.get("certificate")})
    return rows


def log_comparison(root: Path, scenario: str, rows: list[dict[str, Any]], markdown: str) -> str:
    """The comparison table as artifacts (``comparison.md``, ``comparison.json``) of a run in the
    experiment ``<scenario>-comparisons``, apart from the versions' own runs."""
    run_id = tracking.start_run(root, f"{scenario}-comparisons", f"compare {scenario}", {"versions": len(rows)},
                                {"role": "comparison", "scenario": scenario})
    client = tracking.use_store(root)
    client.log_text(run_id, markdown, "comparison.md")
    client.log_text(run_id, json.dumps(rows, indent=2, default=str), "comparison.json")
    tracking.end_run(root, run_id)
    return run_id


# --- Gates and receipt --------------------------------------------------------------------------

class PromotionGates(Gates):
    """When an unlearned version may become ``current``.

    With a retrained reference on the batch's new data version: the gaps to it (``Gates``). Without
    one (``retrain_reference`` off and none registered for that version) the unlearned model must
    keep the source model's test accuracy, and its forget set must look unseen: predicted no better
    than the test set and a membership-inference AUC near chance. Both policies also require a
    certificate class in ``allowed_certificates``. A limit set to None switches its gate off; a
    metric nobody measured (NaN) fails its gate.
    """

    allowed_certificates: list[Guarantee] = Field(
        default_factory=lambda: [Guarantee(g) for g in GUARANTEES if g != NOT_CERTIFIED],
        description="certificate classes an unlearned version may be promoted with")
    max_test_acc_drop: float | None = Field(0.02, ge=0, description="without reference: max source test_acc − "
                                                                    "test_acc")
    max_forget_acc_excess: float | None = Field(0.05, ge=0, description="without reference: max forget_acc − "
                                                                        "test_acc")
    max_mia_auc_excess: float | None = Field(0.05, ge=0, description="without reference: max MIA AUC − 0.5")


def _limit_check(name: str, value: float, limit: float) -> GateCheck:
    return GateCheck(name=name, value=value, limit=limit, passed=not math.isnan(value) and value <= limit)


@task(name="apply-gates", cache_policy=NO_CACHE)
def apply_gates(row: dict[str, Any], reference_row: dict[str, Any] | None, source_row: dict[str, Any],
                gates: PromotionGates) -> GateOutcome:
    allowed = [g.value for g in gates.allowed_certificates]
    checks = [GateCheck(name="certificate", value=row["certificate"], limit=allowed,
                        passed=row["certificate"] in allowed)]
    if reference_row is not None:
        policy = "vs retrained reference"
        checks += [GateCheck(**check) for check in evaluate_gates(row, reference_row, gates).checks]
    else:
        policy = "without reference"
        candidates = [("test_acc_drop_vs_source", measured(source_row, "test_acc") - measured(row, "test_acc"),
                       gates.max_test_acc_drop),
                      ("forget_acc_minus_test_acc", measured(row, "forget_acc") - measured(row, "test_acc"),
                       gates.max_forget_acc_excess),
                      ("mia_auc_minus_chance", measured(row, gates.mia_metric) - 0.5, gates.max_mia_auc_excess)]
        checks += [_limit_check(name, value, limit) for name, value, limit in candidates if limit is not None]
    return GateOutcome(passed=all(c.passed for c in checks), policy=policy, checks=checks)


@task(name="write-receipt", cache_policy=NO_CACHE)
def write_receipt(root: Path, receipt: Receipt) -> Path:
    """``data/receipts/<batch_id>.json``, the same file on the unlearned version's run, and two
    Prefect artifacts of the flow run: the receipt in markdown and the models as a table."""
    path = write_receipt_file(root, receipt)
    if receipt.models.get("unlearned") is not None:
        tracking.use_store(root).log_artifact(receipt.models["unlearned"].run_id, str(path), artifact_path="receipt")
    create_markdown_artifact(key="deletion-receipt", markdown=receipt.markdown(),
                             description=f"receipt of deletion batch {receipt.batch_id}")
    table = [{"model": name, "version": ref.version, "role": ref.role, "data_version": ref.data_version,
              **{key: finite(value) for key, value in receipt.metrics.get(name, {}).items()}}
             for name, ref in receipt.models.items() if ref is not None and name in receipt.metrics]
    create_table_artifact(key="deletion-batch-models", table=table,
                          description=f"models of deletion batch {receipt.batch_id}")
    return path


# --- Backlog: a batch whose data moved on without the model ------------------------------------

@task(name="unlearning-backlog", cache_policy=NO_CACHE)
def unlearning_backlog(root: Path, scenario: str) -> BatchRecord | None:
    """The last batch of ``scenario`` if the ledger applied it but no receipt followed (a crash after
    the ledger append, or `fedunlearn ingest` run on its own): its new data version is the current
    one, and either its unlearned version is registered already (a crash after that: resume to the
    receipt) or no version under the aliases current, retrained, original is on that data version.
    It can be unlearned only from a version on the data before it, while the DVC cache still holds
    that data; otherwise (several ingest-only batches, a purge) the run stops and says to retrain,
    after which the data version has its model and nothing is owed."""
    records = [r for r in load_records(RequestFolders.create(root))
               if r.scenario == scenario and r.status is BatchStatus.COMPLETE]
    current = workspace.data_version(root, scenario) if records else None
    if not records or read_receipt(root, records[-1].batch_id) is not None \
            or records[-1].data_version_after != current:
        return None
    last = records[-1]
    if registered_for_batch.fn(root, scenario, "unlearned", last.batch_id) is not None:
        return last  # killed after registering its version: the resumed batch reports it and writes the receipt
    registered = {alias: v for alias in SOURCE_ALIASES if (v := by_alias(root, scenario, alias)) is not None}
    on = {alias: v.tags.get("data_version") for alias, v in registered.items()}
    if current in on.values():
        return None  # a model was registered on the current data (e.g. `fedunlearn retrain`): nothing owed
    if last.data_version_before in on.values() and workspace.cached(root, last.data_version_before):
        return last
    listing = ", ".join(f"{alias}=v{registered[alias].version} (data version {d})" for alias, d in on.items())
    raise BatchCannotSucceed(
        f"the data of {scenario} moved on to data version {current} (batch {last.batch_id}, applied without "
        f"unlearning) and no registered model can be unlearned to it: " +
        ("the data before that batch is no longer in the DVC cache (purged)" if last.data_version_before in on.values()
         else f"no version is on the data before it ({listing or 'none registered'})") +
        f". Register a model on the current data version with `fedunlearn retrain --scenario {scenario}`, then run "
        f"`fedunlearn process --scenario {scenario}` again")
