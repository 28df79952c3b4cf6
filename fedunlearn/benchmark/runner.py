"""The yardstick: every method judged against retraining, in the same run, on the same data.

    build_setup ─▶ train_original (or reuse) ─▶ retrain ─▶ each method from the same original
               ─▶ Evaluator: accuracies, gaps to retrain, attacks, backdoor, functional distance

Pure core (no orchestration): the ``benchmark`` flow wraps each step in a task and logs rows to
MLflow; tests call these functions with plain tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from fedunlearn.benchmark.settings import train_federation
from fedunlearn.benchmark.spec import RequestSpec
from fedunlearn.certify.certificate import NOT_CERTIFIED, Certificate, certificate_for
from fedunlearn.evaluation.backdoor import attack_success_rate, poison, poison_clients
from fedunlearn.evaluation.cost import CostRecord
from fedunlearn.evaluation.metrics import evaluate_splits, functional_distance, gaps_to_reference
from fedunlearn.evaluation.mia import (AttackResult, attack_metrics, label_matched_nonmembers, run_population_attacks,
                                      ulira_audit)
from fedunlearn.federation.local import State, Tensors, sgd_epochs
from fedunlearn.unlearning.base import DeletionBatch, FederatedState, Outcome, UnlearningMethod

ROW_KEYS = ("method", "scenario", "request", "test_acc", "retain_acc", "forget_acc", "mia_auc", "bd_asr",
            "wall_seconds", "flops", "comm_bytes", "speedup_vs_retrain", "certificate")


def concat(parts: list[Tensors]) -> Tensors:
    """Concatenate splits (all-empty input gives the first, empty, split)."""
    if not any(len(p) for p in parts):
        return parts[0]
    parts = [p for p in parts if len(p)]
    return Tensors(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]),
                   np.concatenate([p.sample_ids for p in parts]))


@dataclass
class EvaluationSets:
    """The test set is split once: half is the pool non-members are drawn from (matched to the
    forget set's label histogram), half trains and tests the shadow model of the Shokri attack."""

    test: Tensors
    retained: Tensors
    forget: Tensors
    nonmembers: Tensors
    shadow_in: Tensors
    shadow_out: Tensors


@dataclass
class BenchmarkSetup:
    scenario: str
    request: RequestSpec
    fed_state: FederatedState  # the original clients' data (triggered forget samples with --backdoor)
    batch: DeletionBatch
    backdoor: bool
    sets: EvaluationSets

    @property
    def seed(self) -> int:
        return self.fed_state.seed


@dataclass
class TrainedModel:
    state: State
    cost: CostRecord
    history: list[dict[str, Any]] = field(default_factory=list)


def build_setup(scenario: str, fed_state: Any, spec: RequestSpec, *, backdoor: bool = False) -> BenchmarkSetup:
    """``fed_state``: the scenario's federation (``settings.load_federation``), untrained."""
    seed, device = fed_state.seed, fed_state.device
    if backdoor and fed_state.setting == "vfl":
        raise ValueError("--backdoor needs every sample's whole image at one client (HFL/DFL image scenarios); "
                         "in VFL each party holds only a slice of it")
    batch = spec.resolve(fed_state.clients, fed_state.num_classes, seed)
    test = fed_state.test
    order = np.random.default_rng([seed, 7]).permutation(len(test))
    pool = test.select(np.isin(np.arange(len(test)), order[: len(order) // 2]))
    shadow = test.select(np.isin(np.arange(len(test)), order[len(order) // 2:]))
    # Non-members share the forget set's (true) label histogram: under label skew anything else
    # measures the label mix, not membership.
    rows = label_matched_nonmembers(fed_state.forget_data(batch).y.cpu().numpy(), pool.y.cpu().numpy(), seed)
    matched = Tensors(pool.x[torch.as_tensor(rows, device=device)], pool.y[torch.as_tensor(rows, device=device)],
                      pool.sample_ids[rows])
    if backdoor:
        fed_state.clients = poison_clients(fed_state.clients, batch.forget_ids)
        # Members now carry the trigger and label 0; so must the non-members they are compared with.
        matched = Tensors(*poison(matched.x, matched.y, np.ones(len(matched), dtype=bool)), matched.sample_ids)
    shadow_half = np.arange(len(shadow)) < len(shadow) // 2
    sets = EvaluationSets(test=test, retained=concat(fed_state.retained_clients(batch)),
                          forget=fed_state.forget_data(batch), nonmembers=matched,
                          shadow_in=shadow.select(shadow_half), shadow_out=shadow.select(~shadow_half))
    return BenchmarkSetup(scenario, spec, fed_state, batch, backdoor, sets)


def train_original(setup: BenchmarkSetup) -> TrainedModel:
    """The original federated training on all data (forget samples included), costed like retrain."""
    return TrainedModel(*train_federation(setup.fed_state, setup.batch))


# In a benchmark a run shorter than this is timed again: one scheduler hiccup of tens of
# milliseconds (a Prefect log flush, another process) would otherwise be the whole measurement.
SHORT_RUN_SECONDS = 1.0
BENCHMARK_TIMINGS = 5


def run_method(setup: BenchmarkSetup, original: State, method: UnlearningMethod, timings: int = 1) -> Outcome:
    """Apply ``method`` to a copy of the original federation (never to another method's result).
    With ``timings`` > 1 (the benchmark), a run under ``SHORT_RUN_SECONDS`` is repeated until
    there are that many timings; the first run's outcome is kept, its wall time becomes their
    median and ``notes["wall_seconds_runs"]`` lists them. Retrain follows the same rule, so
    speed-ups compare like with like."""
    outcome = method.unlearn(dataclasses.replace(setup.fed_state, state=original), setup.batch)
    if timings <= 1 or outcome.cost.wall_seconds >= SHORT_RUN_SECONDS:
        return outcome
    runs = [outcome.cost.wall_seconds] + [
        method.unlearn(dataclasses.replace(setup.fed_state, state=original), setup.batch).cost.wall_seconds
        for _ in range(timings - 1)]
    outcome.cost = dataclasses.replace(outcome.cost, wall_seconds=float(np.median(runs)))
    outcome.notes = {**outcome.notes, "wall_seconds_runs": [round(t, 4) for t in runs]}
    return outcome


class Evaluator:
    """Evaluates models of one setup. The shadow model (Shokri) is trained once, centrally, with
    the scenario's architecture and as many epochs as a client sees in the original training."""

    def __init__(self, setup: BenchmarkSetup):
        self.setup = setup
        fed_state = setup.fed_state
        config = fed_state.train_config
        self.shadow_model = fed_state.model_from(fed_state.engine().initial_state())
        sgd_epochs(self.shadow_model, setup.sets.shadow_in, epochs=config.rounds * config.local_epochs,
                   lr=config.lr, batch_size=config.batch_size, momentum=config.momentum,
                   generator=torch.Generator().manual_seed(setup.seed))

    def evaluate(self, model: nn.Module, reference: nn.Module | None = None) -> tuple[dict[str, Any], dict[str, AttackResult]]:
        sets = self.setup.sets
        metrics: dict[str, Any] = evaluate_splits(model, {"test": sets.test, "retain": sets.retained,
                                                         "forget": sets.forget})
        attacks = run_population_attacks(model, sets.forget, sets.nonmembers,
                                         (self.shadow_model, sets.shadow_in, sets.shadow_out))
        metrics.update(attack_metrics(attacks))
        metrics["bd_asr"] = attack_success_rate(model, sets.test) if self.setup.backdoor else None
        if self.setup.batch.labels:  # class removal: utility on the other classes, forgetting on these
            forgotten = np.isin(sets.test.y.cpu().numpy(), self.setup.batch.labels)
            metrics.update(evaluate_splits(model, {"remaining_classes_test": sets.test.select(~forgotten),
                                                   "forgotten_classes_test": sets.test.select(forgotten)}))
        if reference is not None:
            metrics.update(functional_distance(model, reference, sets.test))
        return metrics, attacks


def ulira(setup: BenchmarkSetup, make_method: Callable[[], UnlearningMethod], num_pairs: int) -> AttackResult:
    """The per-example U-LiRA audit (Hayes et al. 2024) of one method over the forget samples:
    ``2·num_pairs`` shadow federations, each trained with a random half of the forget samples
    and then asked to unlearn exactly that half with the method. AUC ≈ 0.5 means the unlearned
    samples look like samples never trained on. Costs 2·num_pairs trainings: small scenarios."""
    base = setup.fed_state
    if not isinstance(base, FederatedState):
        raise ValueError("the U-LiRA audit rebuilds the clients' data sets: HFL/DFL scenarios only")
    candidates = setup.sets.forget
    retained = base.retained_clients(setup.batch)
    forget_by_client = base.forget_by_client(setup.batch)

    def train_then_unlearn(include_mask: np.ndarray, seed: int) -> nn.Module:
        included = candidates.sample_ids[include_mask]
        clients = [concat([retained[i], forget_by_client[i].select(np.isin(forget_by_client[i].sample_ids,
                                                                             included))])
                   if i in forget_by_client else retained[i] for i in range(len(retained))]
        shadow = dataclasses.replace(base, clients=clients, seed=seed, state={})
        batch = DeletionBatch.for_sample_ids(included, clients)
        trained = train_original(dataclasses.replace(setup, fed_state=shadow, batch=batch))
        outcome = make_method().unlearn(dataclasses.replace(shadow, state=trained.state), batch)
        return shadow.model_from(outcome.state)

    return ulira_audit(train_then_unlearn, candidates, num_pairs, seed=setup.seed)


def original_certificate(setup: BenchmarkSetup) -> Certificate:
    return Certificate(method="original", guarantee=NOT_CERTIFIED, claimed=NOT_CERTIFIED, scenario=setup.scenario,
                       request={"spec": setup.request.text}, batch_id=setup.batch.batch_id,
                       notes=["the original model: nothing has been unlearned"])


def method_certificate(setup: BenchmarkSetup, method: UnlearningMethod, outcome: Outcome) -> Certificate:
    return certificate_for(method, outcome, scenario=setup.scenario,
                           request={"spec": setup.request.text, "kind": setup.batch.kind,
                                    "forget_samples": setup.batch.num_forget},
                           batch_id=setup.batch.batch_id)


def make_row(setup: BenchmarkSetup, method: str, metrics: dict[str, Any], cost: CostRecord,
             certificate: Certificate, retrain_cost: CostRecord | None,
             retrain_metrics: dict[str, Any] | None, notes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A results row: the contract keys first (ROW_KEYS), then every attack's figures, gaps to
    retrain, functional distance and notes."""
    speedup = (retrain_cost.wall_seconds / cost.wall_seconds
               if retrain_cost is not None and cost.wall_seconds > 0 else None)
    row: dict[str, Any] = {
        "method": method, "scenario": setup.scenario, "request": setup.request.text,
        "test_acc": metrics["test_acc"], "retain_acc": metrics["retain_acc"], "forget_acc": metrics["forget_acc"],
        "mia_auc": metrics["mia_auc"], "bd_asr": metrics["bd_asr"], "wall_seconds": cost.wall_seconds,
        "flops": cost.flops, "comm_bytes": cost.comm_bytes, "speedup_vs_retrain": speedup,
        "certificate": certificate.guarantee,
    }
    row.update({k: v for k, v in metrics.items() if k not in row})
    if retrain_metrics is not None:
        row.update(gaps_to_reference(metrics, retrain_metrics, keys=("test_acc", "retain_acc", "forget_acc",
                                                                     "mia_auc", "bd_asr")))
    row["forget_samples"] = setup.batch.num_forget
    row["notes"] = notes or {}
    return row
