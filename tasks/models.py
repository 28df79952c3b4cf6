"""Prefect tasks over the model registry (``stores.registry``): the model a batch unlearns from,
the retrained reference, registering a version, aliases, and a lineage's backdoor samples; the
lineage a version carries in MLflow — its run's data version as a dataset input, and a
description of why the version exists (counts and identifiers only: never a sample ID or row)."""

from __future__ import annotations

from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, Iterator

from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from fedunlearn.certify.gates import GateOutcome
from fedunlearn.config import ScenarioConfig
from fedunlearn.evaluation.records import VersionMetrics
from fedunlearn.receipts import ModelRef
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.unlearning.escalation import is_exact_retrain
from stores.registry import ModelWeights, RegisteredModel
from stores.workspace import Workspace

SOURCE_ALIASES = ("current", "retrained", "original")
BACKDOOR_ARTIFACT = "backdoor_ids.txt"
# The context (``mlflow.data.context``) of a run's data version input, by the role of its version.
DATA_CONTEXTS = MappingProxyType({"original": "training", "retrained": "retraining", "repaid": "retraining",
                                  "unlearned": "unlearning"})
CERTIFICATE_LINES = MappingProxyType({"retrained": "exact retrain", "repaid": "interim (exact on the retrained shards)"})
SHOWN_REQUESTS = 5  # a description lists this many request IDs, then a count


def model_on(ws: Workspace, scenario: str, data_version: str, aliases: tuple[str, ...] = SOURCE_ALIASES
             ) -> RegisteredModel | None:
    """The first of ``aliases`` whose version was trained or unlearned on ``data_version``."""
    for alias in aliases:
        version = ws.registry.by_alias(scenario, alias)
        if version is not None and version.tags.get("data_version") == data_version:
            return ws.registry.load(scenario, str(version.version))
    return None


@contextmanager
def run_failed_on_error(ws: Workspace, run_id: str) -> Iterator[None]:
    """The block's MLflow run ends FAILED if the block raises: a flow that trains for minutes between
    ``start_run`` and registration writes the run's end through here, not into the registry itself."""
    with ws.registry.failed_on_error(run_id):
        yield


@task(name="load-source-model", cache_policy=NO_CACHE)
def load_source_model(ws: Workspace, scenario: str, data_version: str, recorded: str | None = None) -> RegisteredModel:
    """The version a batch unlearns from: it must know exactly the data before the batch, so the
    first of the aliases current, retrained, original on that data version — or ``recorded``, the
    source an attempt of the batch registered already (a run killed after registering, perhaps
    after moving ``current``)."""
    if recorded is not None:
        return ws.registry.load(scenario, recorded)
    found = model_on(ws, scenario, data_version)
    if found is None:
        seen = {alias: (v.version, v.tags.get("data_version")) for alias in SOURCE_ALIASES
                if (v := ws.registry.by_alias(scenario, alias)) is not None}
        listing = ", ".join(f"{a}=v{n} (data version {d})" for a, (n, d) in seen.items()) or "none registered"
        raise ValueError(f"no registered version of {scenario} under the aliases {', '.join(SOURCE_ALIASES)} was "
                         f"trained on data version {data_version} ({listing}), so none can be unlearned from; "
                         f"train one with `fedunlearn train --scenario {scenario}` (no version yet) or "
                         f"`fedunlearn retrain --scenario {scenario}` (the data moved on)")
    return found


def retrained_model(ws: Workspace, scenario: str, data_version: str) -> RegisteredModel | None:
    """The exactly retrained model of ``data_version``, if one is registered."""
    versions = ws.registry.versions(scenario, role="retrained", data_version=data_version)
    return ws.registry.load(scenario, str(versions[-1].version)) if versions else None


@task(name="find-reference", cache_policy=NO_CACHE)
def find_reference(ws: Workspace, scenario: str, data_version: str) -> RegisteredModel | None:
    """The exactly retrained model of ``data_version``, if one is registered."""
    return retrained_model(ws, scenario, data_version)


@task(name="register-version", cache_policy=NO_CACHE)
def register_version(ws: Workspace, scenario: str, weights: ModelWeights, model: nn.Module,
                     input_shape: tuple[int, ...], tags: dict[str, str], params: dict[str, Any],
                     metrics: VersionMetrics, texts: dict[str, str], alias: str | None = None,
                     run_id: str | None = None, description: str | None = None) -> ModelRef:
    """The version metrics and ``texts`` as artifacts of ``run_id`` (a new run with ``params`` and
    its data version ``tags["data_version"]`` as a dataset input if None), then a new registered
    version with ``tags`` and ``description`` (and ``alias``); the run ends."""
    registry = ws.registry
    started = run_id is None
    if started:
        run_id = registry.start_run(scenario, f"{tags['role']}-{tags.get('batch_id', tags['data_version'][:10])}",
                                    params, tags)
    with registry.failed_on_error(run_id):  # a failed registration (a full disk) leaves no run RUNNING
        if started:
            registry.log_data_version(run_id, scenario, tags["data_version"],
                                      DATA_CONTEXTS.get(tags["role"], tags["role"]))
        logged = registry.metrics(run_id)  # a training run's per-round test_acc stays its history
        registry.log_metrics(run_id, {k: v for k, v in metrics.to_dict().items() if k not in logged})
        for name, text in texts.items():
            registry.log_text(run_id, text, name)
        ref = registry.register(run_id, scenario, ws.scenario(scenario).setting, weights, model, input_shape, tags,
                                alias, description)
    registry.end_run(run_id)
    return ref


@task(name="describe-version", cache_policy=NO_CACHE)
def describe_version(ws: Workspace, scenario: str, version: str, description: str) -> None:
    """The version's description in the registry (its page in the MLflow UI)."""
    ws.registry.describe(scenario, version, description)


def training_description(scenario: str, cfg: ScenarioConfig, data_version: str, role: str,
                         batch_id: str | None = None, backdoor: int = 0, kept_from: str | None = None,
                         kept: frozenset[int] = frozenset()) -> str:
    """Why a trained version exists: trained from scratch, on what, how."""
    why = ("**Original**: trained from scratch" if role == "original" else
           f"**Exact retrain of the shards due** from scratch on the current data; shard(s) "
           f"{', '.join(map(str, sorted(kept)))} kept as v{kept_from} serves them (they owe requests due later)"
           if role == "repaid" else
           f"**Exact retrain** from scratch on the data after deletion batch `{batch_id}` (its gates' reference)"
           if batch_id else "**Exact retrain** from scratch on the current data (the data version's reference)")
    train = cfg.train
    lines = [f"{why} by flow `train-federated`.",
             f"- data: `partition@{scenario}` ({cfg.dataset}), data version `{data_version}`",
             (f"- training: {cfg.setting.upper()} `{cfg.model}`, {cfg.partition.num_clients} "
              f"{'parties' if cfg.setting == 'vfl' else 'clients'} ({cfg.partition.scheme}), {train.rounds} rounds × "
              f"{train.local_epochs} local epoch(s), lr {train.lr:g}"),
             f"- certificate: {CERTIFICATE_LINES.get(role, 'not certified (nothing unlearned)')}"]
    if backdoor:
        lines.append(f"- backdoor trigger on {backdoor} training samples")
    return "\n".join(lines)


def batch_description(record: BatchRecord, number: int, steps: int, method: str, options: dict[str, Any],
                      certificate: str, source_version: str | None, gate: GateOutcome | None = None,
                      note: str | None = None) -> str:
    """Why a version of a deletion batch exists: the batch (requests, deleted samples — counted,
    never listed), the method and its options, the certificate, the gates with each check's verdict,
    its step in the escalation, its source version and the data versions before → after."""
    ids = [entry.request_id for entry in record.requests]
    shown = ", ".join(f"`{i}`" for i in ids[:SHOWN_REQUESTS]) + (f", … (+{len(ids) - SHOWN_REQUESTS})"
                                                               if len(ids) > SHOWN_REQUESTS else "")
    kinds = sorted({str(getattr(entry.kind, "value", entry.kind)) for entry in record.requests if entry.kind})
    held_out = len({i for entry in record.requests for i in entry.held_out})
    role = "**Exact retrain**" if is_exact_retrain(method) else "**Unlearned**"
    if gate is not None:
        checks = " · ".join(f"{c.name} {c.verdict}" for c in gate.checks)
        gates, verdict = f"**{gate.verdict}** ({gate.policy}){': ' + checks if checks else ''}", f"**{gate.verdict}**"
        if gate.interim is not None:
            interim = ("may serve (" + ("; ".join(gate.unmeasured) or "every check measured") + ")" if gate.interim
                       else "held back (" + "; ".join(gate.held_back) + ")")
            gates, verdict = gates + f"; interim tier: {interim}", verdict + (", interim ok" if gate.interim else "")
    else:
        gates = note or "pending"
        verdict = gates.split(" (")[0]
    settings = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return "\n".join([  # the first line says it all: the UI shows a run's description folded
        (f"{role} for deletion batch `{record.batch_id}` by `{method}`: gates {verdict}, certificate {certificate} "
         f"(escalation step {number + 1} of {steps})."),
        f"- requests: {len(ids)} ({shown}){', kind ' + '/'.join(kinds) if kinds else ''}",
        f"- deleted samples: {len(record.deleted_ids())}" + (f" ({held_out} held-out)" if held_out else ""),
        f"- method: `{method}`" + (f" ({settings})" if settings else ""),
        f"- certificate: {certificate}",
        f"- gates: {gates}",
        f"- source version: {'v' + source_version if source_version else 'none (trained from scratch)'}",
        f"- data version: `{record.data_version_before}` → `{record.data_version_after}`"])


@task(name="move-alias", cache_policy=NO_CACHE)
def move_alias(ws: Workspace, scenario: str, alias: str, version: str) -> None:
    ws.registry.set_alias(scenario, alias, version)


@task(name="start-run", cache_policy=NO_CACHE)
def start_run(ws: Workspace, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
    """A new MLflow run of ``experiment`` with its parameters and tags; its ID."""
    return ws.registry.start_run(experiment, run_name, params, tags)


@task(name="tag-version", cache_policy=NO_CACHE)
def tag_version(ws: Workspace, scenario: str, version: str, key: str, value: str) -> None:
    ws.registry.set_version_tag(scenario, version, key, value)


@task(name="log-run-metrics", cache_policy=NO_CACHE)
def log_run_metrics(ws: Workspace, run_id: str, metrics: dict[str, float]) -> None:
    ws.registry.log_metrics(run_id, metrics)


@task(name="log-data-version", cache_policy=NO_CACHE)
def log_data_version(ws: Workspace, run_id: str, scenario: str, data_version: str, context: str) -> None:
    """The data version a registered version's run read, as its dataset input (lineage in MLflow)."""
    ws.registry.log_data_version(run_id, scenario, data_version, context)


@task(name="remove-alias", cache_policy=NO_CACHE)
def remove_alias(ws: Workspace, scenario: str, alias: str) -> None:
    ws.registry.remove_alias(scenario, alias)


def backdoor_ids(ws: Workspace, scenario: str) -> list[str]:
    """The samples the lineage's original was trained with the backdoor trigger on (its run's
    ``backdoor_ids.txt``), or none."""
    # By role: alias original leaves a version once it is retired, its run's trigger list stays.
    originals = ws.registry.versions(scenario, role="original")
    original = originals[-1] if originals else None
    if original is None or "backdoor" not in original.tags:
        return []
    text = ws.registry.text(original.run_id, BACKDOOR_ARTIFACT)
    return text.split() if text else []
