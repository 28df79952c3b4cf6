"""The yardstick: every method judged against retraining, in the same run, on the same data.

    build_setup ─▶ train_original (or reuse) ─▶ retrain ─▶ each method from the same original
               ─▶ Evaluator (evaluation/): accuracies, gaps to retrain, attacks, backdoor, distance

The original is trained by the one trainer (``fedunlearn.training``) that the pipeline's flows
use too. Pure core (no orchestration): the ``benchmark`` flow wraps each step in a task and logs
rows to MLflow; tests call these functions with plain tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np
from torch import nn

from fedunlearn.benchmark.spec import RequestSpec
from fedunlearn.certify.certificate import NOT_CERTIFIED, Certificate, certificate_for
from fedunlearn.evaluation.backdoor import poison_clients
from fedunlearn.evaluation.evaluator import EvaluationSets, Evaluator, concat, evaluation_sets
from fedunlearn.evaluation.mia import AttackResult, ulira_audit
from fedunlearn.federation.local import State
from fedunlearn.federation.protocol import Federation
from fedunlearn.training import TrainedModel, train
from fedunlearn.unlearning.base import ForgetSet, FederatedState, Monitor, Outcome, UnlearningMethod


@dataclass
class BenchmarkSetup:
    scenario: str
    request: str  # the SPEC, or what the batch is ("batch <id>")
    fed_state: Federation  # the original clients' data (triggered forget samples with --backdoor)
    forget_set: ForgetSet
    backdoor: bool
    sets: EvaluationSets

    @property
    def seed(self) -> int:
        return self.fed_state.seed

    def evaluator(self) -> Evaluator:
        return Evaluator(self.fed_state, self.forget_set, backdoor=self.backdoor, sets=self.sets)


def build_setup(scenario: str, fed_state: Federation, request: RequestSpec | ForgetSet, *,
                backdoor: bool = False) -> BenchmarkSetup:
    """``fed_state``: the scenario's federation (``training.load_federation``); ``request``: a SPEC
    resolved against it, or a batch already resolved to sample IDs per client (a deletion batch)."""
    if backdoor and fed_state.setting == "vfl":
        raise ValueError("--backdoor needs every sample's whole image at one client (HFL/DFL image scenarios); "
                         "in VFL each party holds only a slice of it")
    if isinstance(request, ForgetSet):
        batch, text = request, f"batch {request.batch_id}"
    else:
        batch, text = request.resolve(fed_state.clients, fed_state.num_classes, fed_state.seed), request.text
    clean_forget_labels = None
    if backdoor:
        clean_forget_labels = fed_state.forget_data(batch).y.cpu().numpy()
        fed_state.clients = poison_clients(fed_state.clients, batch.forget_ids)
    return BenchmarkSetup(scenario, text, fed_state, batch, backdoor,
                          evaluation_sets(fed_state, batch, clean_forget_labels=clean_forget_labels))


def train_original(setup: BenchmarkSetup) -> TrainedModel:
    """The original federated training on all data (forget samples included), costed like retrain;
    its history records test and forget accuracy after every round."""
    monitor = Monitor(setup.fed_state, setup.forget_set)
    model = train(setup.fed_state, on_round=lambda r: monitor.record("train", r.round, r.state,
                                                                       train_loss=r.train_loss))
    model.history = monitor.history
    return model


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
    outcome = method.unlearn(dataclasses.replace(setup.fed_state, state=original), setup.forget_set)
    if timings <= 1 or outcome.cost.wall_seconds >= SHORT_RUN_SECONDS:
        return outcome
    runs = [outcome.cost.wall_seconds] + [
        method.unlearn(dataclasses.replace(setup.fed_state, state=original), setup.forget_set).cost.wall_seconds
        for _ in range(timings - 1)]
    outcome.cost = dataclasses.replace(outcome.cost, wall_seconds=float(np.median(runs)))
    outcome.notes = {**outcome.notes, "wall_seconds_runs": [round(t, 4) for t in runs]}
    return outcome


def ulira(setup: BenchmarkSetup, make_method: Callable[[], UnlearningMethod], num_pairs: int) -> AttackResult:
    """The per-example U-LiRA audit (Hayes et al. 2024) of one method over the forget samples:
    ``2·num_pairs`` shadow federations, each trained with a random half of the forget samples
    and then asked to unlearn exactly that half with the method. AUC ≈ 0.5 means the unlearned
    samples look like samples never trained on. Costs 2·num_pairs trainings: small scenarios."""
    base = setup.fed_state
    if not isinstance(base, FederatedState):
        raise ValueError("the U-LiRA audit rebuilds the clients' data sets: HFL/DFL scenarios only")
    candidates = setup.sets.forget
    retained = base.retained_clients(setup.forget_set)
    forget_by_client = base.forget_by_client(setup.forget_set)

    def train_then_unlearn(include_mask: np.ndarray, seed: int) -> nn.Module:
        included = candidates.sample_ids[include_mask]
        clients = [concat([retained[i], forget_by_client[i].select(np.isin(forget_by_client[i].sample_ids,
                                                                             included))])
                   if i in forget_by_client else retained[i] for i in range(len(retained))]
        shadow = dataclasses.replace(base, clients=clients, seed=seed, state={})
        forget_set = ForgetSet.for_sample_ids(included, clients)
        outcome = make_method().unlearn(dataclasses.replace(shadow, state=train(shadow).state), forget_set)
        return shadow.model_from(outcome.state)

    return ulira_audit(train_then_unlearn, candidates, num_pairs, seed=setup.seed)


def original_certificate(setup: BenchmarkSetup) -> Certificate:
    return Certificate(method="original", guarantee=NOT_CERTIFIED, claimed=NOT_CERTIFIED, scenario=setup.scenario,
                       request={"spec": setup.request}, batch_id=setup.forget_set.batch_id,
                       notes=["the original model: nothing has been unlearned"])


def method_certificate(setup: BenchmarkSetup, method: UnlearningMethod, outcome: Outcome) -> Certificate:
    return certificate_for(method, outcome, scenario=setup.scenario,
                           request={"spec": setup.request, "kind": setup.forget_set.kind,
                                    "forget_samples": setup.forget_set.num_forget},
                           batch_id=setup.forget_set.batch_id)
