"""Prefect tasks over the model registry (``tasks.registry``): the model a batch unlearns from,
the retrained reference, registering a version, aliases, and a lineage's backdoor samples."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from torch import nn

from fedunlearn.evaluation.records import VersionMetrics
from fedunlearn.receipts import ModelRef
from tasks.registry import ModelWeights, RegisteredModel
from tasks.workspace import Workspace

SOURCE_ALIASES = ("current", "retrained", "original")
BACKDOOR_ARTIFACT = "backdoor_ids.txt"


def model_on(ws: Workspace, scenario: str, data_version: str, aliases: tuple[str, ...] = SOURCE_ALIASES
             ) -> RegisteredModel | None:
    """The first of ``aliases`` whose version was trained or unlearned on ``data_version``."""
    for alias in aliases:
        version = ws.registry.by_alias(scenario, alias)
        if version is not None and version.tags.get("data_version") == data_version:
            return ws.registry.load(scenario, str(version.version))
    return None


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


@task(name="find-reference", cache_policy=NO_CACHE)
def find_reference(ws: Workspace, scenario: str, data_version: str) -> RegisteredModel | None:
    """The exactly retrained model of ``data_version``, if one is registered."""
    versions = ws.registry.versions(scenario, role="retrained", data_version=data_version)
    return ws.registry.load(scenario, str(versions[-1].version)) if versions else None


@task(name="register-version", cache_policy=NO_CACHE)
def register_version(ws: Workspace, scenario: str, weights: ModelWeights, model: nn.Module,
                     input_shape: tuple[int, ...], tags: dict[str, str], params: dict[str, Any],
                     metrics: VersionMetrics, texts: dict[str, str], alias: str | None = None,
                     run_id: str | None = None) -> ModelRef:
    """The version metrics and ``texts`` as artifacts of ``run_id`` (a new run with ``params`` if
    None), then a new registered version with ``tags`` (and ``alias``); the run ends."""
    registry = ws.registry
    if run_id is None:
        run_id = registry.start_run(scenario, f"{tags['role']}-{tags.get('batch_id', tags['data_version'][:10])}",
                                    params, tags)
    logged = registry.metrics(run_id)  # a training run's per-round test_acc stays its history
    registry.log_metrics(run_id, {k: v for k, v in metrics.to_dict().items() if k not in logged})
    for name, text in texts.items():
        registry.log_text(run_id, text, name)
    ref = registry.register(run_id, scenario, ws.scenario(scenario).setting, weights, model, input_shape, tags, alias)
    registry.end_run(run_id)
    return ref


@task(name="move-alias", cache_policy=NO_CACHE)
def move_alias(ws: Workspace, scenario: str, alias: str, version: str) -> None:
    ws.registry.set_alias(scenario, alias, version)


@task(name="remove-alias", cache_policy=NO_CACHE)
def remove_alias(ws: Workspace, scenario: str, alias: str) -> None:
    ws.registry.remove_alias(scenario, alias)


def backdoor_ids(ws: Workspace, scenario: str) -> list[str]:
    """The samples the lineage's original was trained with the backdoor trigger on (its run's
    ``backdoor_ids.txt``), or none."""
    original = ws.registry.by_alias(scenario, "original")
    if original is None or "backdoor" not in original.tags:
        return []
    text = ws.registry.text(original.run_id, BACKDOOR_ARTIFACT)
    return text.split() if text else []
