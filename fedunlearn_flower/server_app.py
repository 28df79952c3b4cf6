"""The ServerApp: one job — train the scenario by FedAvg, unlearn a deletion batch, or both —
described by a JSON file (``Job``) whose path the run configuration carries (``job``).

Whatever happens, the ServerApp leaves ``status.json`` in the job's output folder: ``ok`` with
what was run, or the error's type and message; the models it produced are torch files of tensors
there (``trained.pt``, ``unlearned.pt``), read back with ``torch.load(..., weights_only=True)``.
That is how the runners (``simulation``, ``deployment``) learn the outcome on either engine.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedunlearn.errors import InputError
from fedunlearn.federation.forget_set import ForgetSet
from fedunlearn.federation.fedavg import RoundResult
from fedunlearn.federation.local import State
from fedunlearn_flower.fedavg import FedAvg
from fedunlearn_flower.federation import Federation
from fedunlearn_flower.fedquit import FedQUIT
from fedunlearn_flower.finetune import FineTune
from fedunlearn_flower.gradient_ascent import GradientAscent
from fedunlearn_flower.hf_kcu import HFKCU
from fedunlearn_flower.partition import Scenario
from fedunlearn_flower.puf import PUFRegular, PUFSpecial

# Named as the registry names the in-process methods they wrap (``OverFlower.in_process``).
ALGORITHMS = {strategy.in_process.name: strategy
              for strategy in (PUFSpecial, PUFRegular, HFKCU, GradientAscent, FineTune, FedQUIT)}
STATUS, TRAINED, UNLEARNED, STEP = "status.json", "trained.pt", "unlearned.pt", "step.pt"
ROUND = "round-{}.pt"  # the global model after training round n (from 1), for the caller's per-round metrics


@dataclass
class Job:
    """What the ServerApp runs. ``rounds``: training rounds (None: the scenario's; 0: no training,
    start from ``state``). ``method`` with ``params`` and ``batch`` (``ForgetSet.to_dict``):
    the unlearning after it; ``step_only`` stops PUF after its unlearning round (no recovery)."""

    root: str
    scenario: str
    out_dir: str
    rounds: int | None = None
    state: str | None = None
    method: str | None = None
    params: dict = field(default_factory=dict)
    batch: dict | None = None
    step_only: bool = False
    connect_timeout: float = 60.0
    round_timeout: float = 600.0

    def write(self) -> Path:
        path = Path(self.out_dir) / "job.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        return path

    @classmethod
    def read(cls, path: str | Path) -> "Job":
        return cls(**json.loads(Path(path).read_text()))


def run_job(grid: Grid, job: Job) -> dict:
    """Run ``job`` on ``grid``; ``status.json`` says how it went, whatever happens."""
    out, start = Path(job.out_dir), time.perf_counter()
    try:
        notes = _run(grid, job, out)
    except Exception as err:
        _write_status(out, {"ok": False, "error": type(err).__name__, "message": str(err),
                            "clients": getattr(err, "clients", [])})
        raise
    status = {"ok": True, "seconds": time.perf_counter() - start, **notes}
    _write_status(out, status)
    return status


def _run(grid: Grid, job: Job, out: Path) -> dict:
    scenario = Scenario.load(job.root, job.scenario)
    config = scenario.config.train if not job.rounds else scenario.config.train.model_copy(update={"rounds": job.rounds})
    training = FedAvg.from_config(config)
    federation = Federation(grid, scenario, job.root, connect_timeout=job.connect_timeout,
                            round_timeout=job.round_timeout).connect()
    state = _load(job.state) if job.state else training.initial_state(federation)
    notes: dict = {"nodes": {str(c): n for c, n in federation.nodes.items()}}
    if job.rounds != 0:
        rounds = RoundLog(out)
        state = training.run(federation, state, on_round=rounds)
        notes["rounds"] = rounds.records
        _save(out / TRAINED, state)
    if job.method:
        algorithm, batch = ALGORITHMS[job.method](**job.params), ForgetSet.from_dict(job.batch)
        if job.step_only:
            if not hasattr(algorithm, "step"):
                raise InputError(f"{job.method} has no separate unlearning round: step_only applies to PUF")
            _save(out / STEP, algorithm.step(federation, state, batch, training))
        else:
            unlearned, notes["unlearning"] = algorithm.run(federation, state, batch, training)
            _save(out / UNLEARNED, unlearned)
    return notes


class RoundLog:
    """Each training round as the in-process engine's monitor sees it (``fedunlearn.unlearning.base.
    fedavg_rounds``): the global model after it (``round-<n>.pt``), the updates' sample-weighted
    training loss, and the participants and samples PUF Appendix B's cost counts."""

    def __init__(self, out: Path):
        self.out = out
        self.records: list[dict] = []

    def __call__(self, result: RoundResult) -> None:
        number = len(self.records) + 1
        _save(self.out / ROUND.format(number), result.state)
        self.records.append({"round": number, "train_loss": result.train_loss, "clients": len(result.updates),
                             "samples": sum(update.num_samples for update in result.updates)})


def _save(path: Path, state: State) -> None:
    torch.save({k: v.detach().cpu() for k, v in state.items()}, path)


def _load(path: str | Path) -> State:
    return torch.load(path, map_location="cpu", weights_only=True)


def _write_status(out: Path, status: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (STATUS + ".tmp")
    tmp.write_text(json.dumps(status, indent=2, sort_keys=True, default=str))
    tmp.replace(out / STATUS)  # a runner polling for the file never reads half of it


def server_app(job: Job | None = None) -> ServerApp:
    """A ServerApp running ``job``, or (None) the job named by the run configuration's ``job``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_job(grid, job or Job.read(str(context.run_config["job"])))

    return app


app = server_app()
