"""Flow ``train-federated``: reproduce data → validate → federated training → register, for every
setting (FedAvg, split-NN, D-PSGD — ``fedunlearn.training``, the benchmark's trainer too).

    dvc repro (prepare, partition) ─▶ Great Expectations ─▶ training rounds (client / party /
    node updates as task runs) ─▶ MLflow run + per-round metrics ─▶ registered version, alias
    ``original`` (``retrained`` when the retrain-reference flow trains the gold standard)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from prefect import flow, get_run_logger
from pydantic import Field

from fedunlearn.benchmark.spec import parse_request
from fedunlearn.certify.certificate import EXACT_RETRAIN, NOT_CERTIFIED
from fedunlearn.config import Runtime
from fedunlearn.device import intra_op_threads
from fedunlearn.evaluation.backdoor import attack_success_rate, poison_clients
from fedunlearn.evaluation.evaluator import concat
from fedunlearn.evaluation.records import VersionMetrics
from fedunlearn.federation.local import map_inline
from fedunlearn.federation.protocol import Federation
from fedunlearn.federation.cost import Cost
from fedunlearn.receipts import ModelRef
from fedunlearn.runtime_choice import check_flower_training, flower_engine, runtime_tag, training_runtime
from fedunlearn.sharded_federation import ShardedFederation
from fedunlearn.training import TrainedModel, TrainingRound, train
from fedunlearn.training_gate import TrainingRejected, judge_training
from flows.results import TrainResult
from runtime import progress
from tasks.data import command_device, load_data, reproduce_data, validate_partition
from tasks.evaluation import accuracy
from tasks.models import (BACKDOOR_ARTIFACT, DATA_CONTEXTS, backdoor_ids, log_data_version, register_version,
                          run_failed_on_error, start_run, training_description)
from stores.registry import ModelWeights
from tasks.shards import SHARDS_ARTIFACT, clear_checkpoints, reusable_shards, save_checkpoint, shard_lineage
from tasks.training import map_with_prefect, train_through_flower
from stores.workspace import ScenarioScope, Workspace


SHARD_METRIC_PREFIX = "shard_"  # a federation in shards: shard k's rounds under shard_<k>/test_acc, .../train_loss
RUNNER_FIELD = ("the engine that trains: in-process (our loop), flower (a local Flower deployment: a SuperLink and a "
                "SuperNode per client on 127.0.0.1) or flower-simulation (Flower's simulation engine); Flower runs HFL "
                "scenarios only. Empty: the scenario's runner in params.yaml, else in-process")


@dataclass(frozen=True)
class Training:
    """What a training is for: ``role`` original, or retrained (the exact reference of the data
    version, alias retrained) for ``batch_id``, or repaid (a federation in shards retrained from
    scratch except the shards ``kept``, whose models are taken as they are from version ``kept_from``:
    ``fedunlearn.shard_debt``); each client update a task run (``client_tasks``); the request SPEC whose
    samples get the backdoor trigger; the engine asked for (empty: the scenario's for an original,
    in-process for a retrain)."""

    role: Literal["original", "retrained", "repaid"] = "original"
    batch_id: str | None = None
    client_tasks: bool = True
    backdoor_request: str | None = None
    runtime: Runtime | None = None
    kept_from: str | None = None
    kept: frozenset[int] = frozenset()


@flow(name="train-federated", log_prints=True)
def train_federated(scenario: str = "mnist5k-hfl", root: str = ".", rounds: int | None = None,
                    local_epochs: int | None = None, client_tasks: bool = True,
                    device: str | None = None, backdoor_request: str | None = None,
                    role: Literal["original", "retrained"] = "original", batch_id: str | None = None,
                    runner: Runtime | None = Field(None, description=RUNNER_FIELD)) -> TrainResult:
    """Train the scenario's federated model (any setting) from scratch on the current data version
    and register it (tag ``runtime`` naming the engine). Backdoor samples still in the data carry the
    trigger again when a retrain reproduces the lineage.

    Args:
        scenario: a scenario of the workspace's params.yaml.
        root: the workspace (the directory holding params.yaml).
        rounds: training rounds; empty: the scenario's.
        local_epochs: local epochs per round; empty: the scenario's.
        client_tasks: each client, party or node update a task run (off: inline).
        device: auto, cpu, cuda or mps; empty: params.yaml's device.
        backdoor_request: a request SPEC whose samples get the 4×4 trigger (target label 0) before training.
        role: original, or retrained (the exact reference of the data version, alias retrained).
        batch_id: the deletion batch a retrained version is the reference for.
    """
    ws = Workspace.open(root)
    scope = ScenarioScope(ws, scenario).with_training(rounds, local_epochs)
    job = Training(role, batch_id, client_tasks, backdoor_request, runner)
    check_training(scope, job, local_epochs)
    with intra_op_threads(scope.config.threads):
        return train_model(scope, command_device(ws, device), reproduce_data(ws, scenario), job)


def check_training(scope: ScenarioScope, job: Training, local_epochs: int | None = None) -> None:
    """What cannot be trained as asked is refused before any work."""
    if job.backdoor_request and scope.config.setting == "vfl":
        raise ValueError("--backdoor needs every sample's whole image at one client (HFL/DFL); in VFL each party "
                         "holds only a slice of it")
    check_flower_training(training_runtime(job.runtime, scope.config.runner, job.role), scope.scenario,
                          scope.config.setting, backdoor=bool(job.backdoor_request), local_epochs=local_epochs)


def train_model(scope: ScenarioScope, device: torch.device, data_version: str,
                job: Training = Training()) -> TrainResult:
    """``scope``'s federated model trained from scratch on ``data_version`` (the workspace's current
    one, which the caller holds) on ``device`` and registered with alias ``job.role``; each step a
    task run of the caller's flow (a command's, or the deletion batch's exact retrain)."""
    started = time.perf_counter()
    ws, scenario, cfg = scope.ws, scope.scenario, scope.config
    engine = training_runtime(job.runtime, cfg.runner, job.role)
    validate_partition(ws, scenario)
    poisoned = backdoor_ids(ws, scenario) if job.role != "original" else []
    federation = load_data(ws, scenario, device, map_updates=map_with_prefect if job.client_tasks
                           else map_inline, backdoor_ids=poisoned)
    tags = {"role": job.role, "scenario": scenario, "data_version": data_version,
            "certificate": EXACT_RETRAIN if job.role == "retrained" else NOT_CERTIFIED,  # nothing unlearned, or kept
            "runtime": runtime_tag(engine), **({"batch_id": job.batch_id} if job.batch_id else {}),
            **({"source_version": job.kept_from, "forgetting": "interim"} if job.role == "repaid" else {})}
    if job.backdoor_request:
        poisoned = put_backdoor(federation, job.backdoor_request, ws.params.seed)
    if poisoned:
        tags["backdoor"] = job.backdoor_request or "inherited"
    run_id = start_run(ws, scenario, f"train-{scenario}", {
        "scenario": scenario, "dataset": cfg.dataset, "setting": cfg.setting, "model": cfg.model,
        "seed": ws.params.seed, "device": str(device), "data_version": data_version,
        **{f"partition.{k}": v for k, v in cfg.partition.model_dump().items()},
        **{f"train.{k}": v for k, v in cfg.train.model_dump().items()}}, tags)
    # Training takes minutes: a failure in it (or a full disk at registration) ends the run as FAILED.
    with run_failed_on_error(ws, run_id):
        log_data_version(ws, run_id, scenario, data_version, DATA_CONTEXTS[job.role])
        ref, metrics = train_and_register(scope, federation, tags, run_id, poisoned, training_description(
            scenario, cfg, data_version, job.role, job.batch_id, len(poisoned), job.kept_from, job.kept),
            kept_shards(scope, federation, job))
    get_run_logger().info("registered %s version %s (alias %r), test_acc=%.4f", scenario, ref.version, job.role,
                          metrics.test_acc)
    return TrainResult(scenario=scenario, data_version=data_version, test_acc=metrics.test_acc,
                       model_version=ref.version, run_id=run_id, device=str(device),
                       wall_seconds=time.perf_counter() - started, backdoor_samples=len(poisoned),
                       runtime=tags["runtime"])


def put_backdoor(federation: Federation, request: str, seed: int) -> list[str]:
    """The 4×4 trigger on the samples ``request`` names; returns their IDs."""
    batch = parse_request(request).resolve(federation.clients, federation.num_classes, seed)
    federation.clients = poison_clients(federation.clients, batch.forget_ids)
    print(f"backdoor trigger on {batch.num_forget} samples of clients {batch.affected_clients}")
    return [i for ids in batch.forget_ids.values() for i in ids.tolist()]


@dataclass
class FlowerTrained:
    """A model Flower trained, in the shape ``train`` returns (no per-node states in HFL)."""

    state: dict
    cost: Cost
    node_states: None = None


def runtime_runner(tags: dict[str, str]) -> Runtime:
    """The runner a version's ``runtime`` tag names."""
    return next(r for r in Runtime if runtime_tag(r) == tags["runtime"])


def flower_trained(scope: ScenarioScope, runner: Runtime,
                   on_round: Callable[[TrainingRound], None]) -> FlowerTrained:
    """The scenario trained through Flower: its rounds run in Flower's processes, ``on_round`` sees
    each one's model afterwards; the registered version's metrics are computed below as for ours."""
    state, runtime, cost = train_through_flower(scope.ws, scope.scenario, flower_engine(runner),
                                                scope.config.train.rounds, on_round)
    print(f"trained through Flower ({runtime}) in {cost.wall_seconds:.1f} s")
    return FlowerTrained(state, cost)


def kept_shards(scope: ScenarioScope, federation: Federation, job: Training) -> dict[int, dict]:
    """The shard models a partial repayment keeps as version ``job.kept_from`` serves them."""
    if not job.kept or not isinstance(federation, ShardedFederation):
        return {}
    states = federation.shard_states(scope.ws.registry.load(scope.scenario, job.kept_from).state)
    return {k: {name: v.to(federation.device) for name, v in states[k].items()} for k in sorted(job.kept)}


def train_and_register(scope: ScenarioScope, federation: Federation, tags: dict[str, str], run_id: str,
                       poisoned: list[str], description: str, kept: dict[int, dict] | None = None
                       ) -> tuple[ModelRef, VersionMetrics]:
    """Train from scratch (but the shards ``kept``), each round's metrics on ``run_id``, and register
    the result with alias ``tags["role"]`` (a partial repayment: no alias; its caller moves current)."""
    ws, scenario, cfg = scope.ws, scope.scenario, scope.config
    losses: list[float] = []
    with ws.registry.step_metrics(run_id) as log_round:
        def report(step: TrainingRound) -> None:
            losses.append(float(step.train_loss))
            sharded = isinstance(federation, ShardedFederation) and step.shard is not None
            shown = federation.shard(step.shard, {}) if sharded else federation  # one shard: its own model
            test_acc = accuracy(shown.model_from(step.state), federation.test)
            # A shard's rounds are its own curve: the version's ``test_acc`` is the served ensemble's alone.
            key = f"{SHARD_METRIC_PREFIX}{step.shard}/" if sharded else ""
            log_round({f"{key}test_acc": test_acc, f"{key}train_loss": step.train_loss}, step.round)
            print(f"{'shard ' + str(step.shard) + ' ' if sharded else ''}round {step.round}/{cfg.train.rounds}: "
                  f"test_acc={test_acc:.4f} train_loss={step.train_loss:.4f}")
            progress.report(training_label(scenario, tags["role"], step.shard), step.round, cfg.train.rounds,
                            f"round {step.round}/{cfg.train.rounds}, test_acc {test_acc:.4f}")

        if isinstance(federation, ShardedFederation):
            trained, shard_texts = train_in_shards(ws, scenario, federation, tags, report, kept)
        else:
            trained, shard_texts = (train(federation, on_round=report) if flower_engine(runtime_runner(tags)) is None
                                    else flower_trained(scope, runtime_runner(tags), report)), {}
    model = federation.model_from(trained.state)
    # Every registered version's run carries the same metric keys (``VersionMetrics``); no forget set
    # yet: forget accuracy and MIA AUC are NaN, which a deletion batch replaces when this model is its
    # retrained reference.
    metrics = VersionMetrics.of(None, trained.cost)
    metrics.test_acc = accuracy(model, federation.test)
    metrics.retain_acc = accuracy(model, concat(federation.clients))
    metrics.forget_acc = metrics.mia_auc = math.nan
    if poisoned:
        metrics.bd_asr = attack_success_rate(model, federation.test)
    if tags["role"] == "original":  # a failed training is not registered as a model to serve
        gate_original(scenario, cfg.train, metrics.test_acc, federation.test.y.cpu().numpy(), losses)
    ref = register_version(ws, scenario, ModelWeights(trained.state, trained.node_states), model,
                           tuple(federation.test.x.shape[1:]), tags, {}, metrics,
                           {**shard_texts, **({BACKDOOR_ARTIFACT: "\n".join(sorted(poisoned)) + "\n"} if poisoned
                                              else {})},
                           alias=None if tags["role"] == "repaid" else tags["role"], run_id=run_id,
                           description=description)
    if isinstance(federation, ShardedFederation):
        clear_checkpoints(ws, scenario)
    return ref, metrics


def gate_original(scenario: str, train_cfg, test_acc: float, test_labels, losses: list[float]) -> None:
    """``TrainingRejected`` (exit 2, the MLflow run ends FAILED, nothing registered) for an original
    whose training failed (``fedunlearn.training_gate``)."""
    verdict = judge_training(test_acc, test_labels, losses, train_cfg.min_test_acc, train_cfg.lr, train_cfg.momentum,
                             train_cfg.rounds)
    if not verdict.passed:
        raise TrainingRejected(verdict.message(scenario))


def training_label(scenario: str, role: str, shard: int | None = None) -> str:
    """What the progress of a training says it is: the original, or an exact retrain (a batch's
    reference, a repayment), and the shard."""
    what = "training" if role == "original" else "exact retrain of"
    return f"{what} {scenario}" + (f" shard {shard}" if shard is not None else "")


def train_in_shards(ws: Workspace, scenario: str, federation: ShardedFederation, tags: dict[str, str],
                    report: Callable[[TrainingRound], None], kept: dict[int, dict] | None = None
                    ) -> tuple[TrainedModel, dict[str, str]]:
    """A sharded scenario trained shard by shard, each checkpointed once trained; an exact retrain
    (role ``retrained`` or ``repaid``) reuses every shard whose data is unchanged (``tasks.shards``),
    and a partial repayment the shards it ``kept`` (unless a model trained from scratch on their data
    exists). Adds the shard lineage to ``tags``; returns the model and ``shards.json``."""
    reuse, origins = reusable_shards(ws, scenario, federation, registered=tags["role"] != "original")
    for index, state in (kept or {}).items():
        if index not in reuse:
            reuse[index], origins[index] = state, f"kept:v{tags['source_version']}"
    if reuse:
        print(f"shard(s) {', '.join(map(str, sorted(reuse)))} of {federation.count} unchanged: "
              + ", ".join(f"{k} {origins[k]}" for k in sorted(reuse)))
    trained = train(federation, on_round=report, reuse=reuse,
                    on_shard=lambda k, state: save_checkpoint(ws, scenario, federation.digest(k), state))
    shard_tags, text = shard_lineage(federation, trained, origins)
    tags.update(shard_tags)
    return trained, {SHARDS_ARTIFACT: text}
