"""What a pipeline task calls to train or unlearn through Flower: one function
per step, the engine chosen by name, the ``runtime`` tag of the version it produced returned with
the model. Tasks keep registering, gating and writing receipts as they do for the in-process
engine; nothing here touches a store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from fedunlearn.errors import InputError
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.cost import Cost, communication_bytes, flops_per_sample, training_flops
from fedunlearn.federation.local import State
from fedunlearn.training import TrainingRound
from fedunlearn.unlearning.base import num_params
from fedunlearn_flower.deployment import run_deployed
from fedunlearn_flower.partition import CPU, Scenario
from fedunlearn_flower.results import FlowerResult
from fedunlearn_flower.server_app import ALGORITHMS, ROUND, Job
from fedunlearn_flower.simulation import run_simulated

# The version tag ``runtime`` of a model each runner produced (the in-process engine's: ``in-process``).
RUNTIMES = {"simulation": "flower-simulation", "deployment": "flower-deployment"}


def run_flower(job: Job, runner: str, *, superlink: str | None = None) -> tuple[FlowerResult, str]:
    """``job`` on the ``simulation`` engine or a ``deployment`` (local, or ``superlink``'s)."""
    if runner not in RUNTIMES:
        raise InputError(f"unknown Flower runner {runner!r}; choose {' or '.join(RUNTIMES)}")
    if runner == "simulation":
        return run_simulated(job), RUNTIMES[runner]
    return run_deployed(job, superlink=superlink), RUNTIMES[runner]


def train_with_flower(root: str | Path, scenario: str, out_dir: str | Path, *, runner: str = "simulation",
                      superlink: str | None = None, rounds: int | None = None,
                      on_round: Callable[[TrainingRound], None] | None = None) -> tuple[State, str, Cost]:
    """The scenario trained by FedAvg through Flower (``rounds``: None for the scenario's), its
    runtime tag and its cost. ``on_round`` sees each round's model and training loss, numbered from
    1 as the in-process trainer's does, once the run has ended (the rounds ran in Flower's processes)."""
    job = Job(root=str(root), scenario=scenario, out_dir=str(out_dir), rounds=rounds)
    result, runtime = run_flower(job, runner, superlink=superlink)
    records = result.notes.get("rounds", [])
    for record in records if on_round is not None else []:
        state = torch.load(Path(out_dir) / ROUND.format(record["round"]), map_location="cpu", weights_only=True)
        on_round(TrainingRound(int(record["round"]), state, float(record["train_loss"])))
    return result.trained, runtime, training_cost(Scenario.load(root, scenario), records, result.trained,
                                                  result.seconds)


def training_cost(scenario: Scenario, rounds: list[dict], state: State, seconds: float) -> Cost:
    """PUF Appendix B's cost of the rounds the ServerApp recorded, counted as the in-process trainer
    counts its own (``fedunlearn.unlearning.base.fedavg_rounds``): F·E·Σ n_i FLOPs over the sampled
    clients' samples, 2·P·B·|S_t| bytes a round; the wall time is the run's, the engine's start and stop
    included."""
    per_sample = flops_per_sample(scenario.model_fn().to(CPU), tuple(scenario.manifest["input_shape"]))
    flops = training_flops(per_sample, sum(int(r["samples"]) for r in rounds), scenario.config.train.local_epochs)
    return Cost(seconds, flops, communication_bytes(num_params(state), [int(r["clients"]) for r in rounds]))


def unlearn_with_flower(root: str | Path, scenario: str, out_dir: str | Path, state: State, method: str,
                        params: dict, forget_set: ForgetSet, *, runner: str = "simulation",
                        superlink: str | None = None) -> tuple[State, dict, str]:
    """``state`` with ``forget_set`` forgotten by ``method`` through Flower: the model, the run's notes
    and its runtime tag."""
    if method not in ALGORITHMS:
        raise InputError(f"method {method!r} has no Flower version; choose one of {', '.join(ALGORITHMS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in state.items()}, out / "initial.pt")
    job = Job(root=str(root), scenario=scenario, out_dir=str(out), rounds=0, state=str(out / "initial.pt"),
              method=method, params=params, batch=forget_set.to_dict())
    result, runtime = run_flower(job, runner, superlink=superlink)
    return result.unlearned, result.notes.get("unlearning", {}), runtime
