"""The same job on the three engines, side by side (docs/flower.md "Measured"): train digits-hfl by
FedAvg, then forget a sample batch by PUF-Special with its recovery rounds — in-process, on Flower's
simulation engine (Ray) and on a local Flower deployment (a SuperLink and three SuperNode processes
on 127.0.0.1). Prints a Markdown table: wall time (engine start and stop included), test accuracy
after training and after unlearning, accuracy on the forgotten samples, and the largest weight
difference from the in-process models.

    .venv/bin/python scripts/flower_engines.py [--workdir DIR] [--recovery 2] [--forget 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from flower_helpers import SCENARIO, in_process, max_difference, prepared_workspace, sample_batch  # noqa: E402

from fedunlearn.federation.local import accuracy  # noqa: E402
from fedunlearn.unlearning import get_method  # noqa: E402
from fedunlearn_flower.deployment import run_deployed  # noqa: E402
from fedunlearn_flower.server_app import Job  # noqa: E402
from fedunlearn_flower.simulation import run_simulated  # noqa: E402


def in_process_run(root: Path, batch, recovery: int) -> tuple[float, dict, dict]:
    start = time.perf_counter()
    fed = in_process(root, rounds=fed_rounds(root))
    unlearned = get_method("puf-special", max_recovery_rounds=recovery).unlearn(fed, batch).state
    return time.perf_counter() - start, fed.state, unlearned


def fed_rounds(root: Path) -> int:
    from fedunlearn_flower.partition import Scenario

    return Scenario.load(root, SCENARIO).config.train.rounds


def flower_run(runner, root: Path, out: Path, batch, recovery: int) -> tuple[float, dict, dict]:
    job = Job(root=str(root), scenario=SCENARIO, out_dir=str(out), method="puf-special",
              params={"max_recovery_rounds": recovery}, batch=batch.to_dict(), round_timeout=300)
    result = runner(job)
    return result.seconds, result.trained, result.unlearned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--recovery", type=int, default=2, help="PUF-Special's recovery rounds")
    parser.add_argument("--forget", type=int, default=10, help="samples of client 1 to forget")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as each Flower process runs: the same reduction order, the same floats
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="flower-engines-"))
    root = prepared_workspace(workdir / "workspace")
    batch = sample_batch(root, count=args.forget)
    fed = in_process(root, rounds=1)
    forget = fed.forget_data(batch)
    runs = {"in-process": in_process_run(root, batch, args.recovery),
            "flower simulation (Ray, 1 CPU per client)": flower_run(run_simulated, root, workdir / "sim", batch,
                                                                    args.recovery),
            "flower local deployment (SuperLink + 3 SuperNodes)": flower_run(
                lambda job: run_deployed(job, timeout=900), root, workdir / "dep", batch, args.recovery)}
    reference = runs["in-process"]
    print(f"digits-hfl, {fed_rounds(root)} FedAvg rounds, then PUF-Special on {args.forget} samples of client 1 "
          f"with {args.recovery} recovery rounds\n")
    print("| engine | wall s | test acc trained | test acc unlearned | forget acc unlearned | max abs diff vs in-process |")
    print("|---|---|---|---|---|---|")
    for name, (seconds, trained, unlearned) in runs.items():
        row = [f"{seconds:.1f}", f"{accuracy(fed.model_from(trained), fed.test):.4f}",
               f"{accuracy(fed.model_from(unlearned), fed.test):.4f}",
               f"{accuracy(fed.model_from(unlearned), forget):.2f}",
               f"{max(max_difference(trained, reference[1]), max_difference(unlearned, reference[2])):.1e}"]
        print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
