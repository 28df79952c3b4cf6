"""How much one method's forgetting depends on float noise: the same request over seeds, torch
thread counts and deterministic / non-deterministic kernels, with the exact retrain of each run.

For every seed and thread count the original is trained and retrained (timed) once, with
deterministic kernels; the method then runs on that original once per kernel setting, so the
kernels, the thread count and the seed each change the float arithmetic of the run. Each run
records the forget accuracy (argmax on the forget set), the forgotten classes' test accuracy for a
class request, the test accuracy, the certificate and the speed-up against the retrain of the same
seed and thread count. ``--options`` adds method settings (JSON); ``--compare`` runs a second
setting on the same originals (for FedORA: ``'{"class_margin": null}'``, the paper's iteration alone).

    .venv/bin/fedunlearn init /tmp/w && .venv/bin/fedunlearn --root /tmp/w prepare --scenario mnist5k-vfl
    nice -n 10 .venv/bin/python scripts/forgetting_spread.py --root /tmp/w --scenario mnist5k-vfl \\
        --request class:1,7 --method fedora --seeds 10 --threads 1,2 --compare '{"class_margin": null}'

Prints one table row per (setting, threads, kernels) — mean, min, max and spread (max − min) of
the forget accuracy, the worst forgotten-class test accuracy, the speed-up's mean and minimum,
the certificates — and writes every run to ``--out`` (JSON) when given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch

from fedunlearn.benchmark import yardstick
from fedunlearn.benchmark.spec import parse_request
from fedunlearn.certify.certificate import certificate_for
from fedunlearn.config import load_params
from fedunlearn.evaluation.evaluator import correctness
from fedunlearn.training import load_federation, train
from fedunlearn.unlearning.registry import get_method


def one_seed(args, seed: int, threads: int, settings: dict[str, dict]) -> list[dict]:
    """Train and retrain once (deterministic kernels), then every setting under both kernel modes."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    params = load_params(args.root / "params.yaml").model_copy(update={"seed": seed})
    federation = load_federation(args.scenario, params, args.root, torch.device("cpu"))
    setup = yardstick.build_setup(args.scenario, federation, parse_request(args.request))
    original = train(setup.fed_state).state
    kind, setting = setup.forget_set.kind, setup.fed_state.setting
    retrain = yardstick.run_method(setup, original, get_method("retrain", setting=setting, kind=kind),
                                timings=yardstick.BENCHMARK_TIMINGS)
    rows = []
    for deterministic in (True, False):
        torch.use_deterministic_algorithms(deterministic)
        for label, options in settings.items():
            method = get_method(args.method, setting=setting, kind=kind, **options)
            outcome = yardstick.run_method(setup, original, method, timings=yardstick.BENCHMARK_TIMINGS)
            rows.append({"setting": label, "seed": seed, "threads": threads, "deterministic": deterministic,
                         **measure(setup, outcome.state), "certificate": certificate_for(method, outcome).guarantee,
                         "speedup": retrain.cost.wall_seconds / outcome.cost.wall_seconds})
    torch.use_deterministic_algorithms(False)
    return rows


def measure(setup: yardstick.BenchmarkSetup, state) -> dict:
    model = setup.fed_state.model_from(state)
    test = correctness(model, setup.sets.test)
    figures = {"forget_acc": float(correctness(model, setup.sets.forget).mean()), "test_acc": float(test.mean())}
    if setup.forget_set.labels:
        forgotten = np.isin(setup.sets.test.y.cpu().numpy(), setup.forget_set.labels)
        figures["forgotten_classes_test_acc"] = float(test[forgotten].mean())
    return figures


def table(runs: list[dict]) -> str:
    groups = defaultdict(list)
    for run in runs:
        groups[(run["setting"], run["threads"], run["deterministic"])].append(run)
    lines = ["| setting | threads | kernels | seeds | forget acc mean | min | max | spread | forgotten-class "
             "test acc max | test acc mean | speed-up mean | speed-up min | certificates |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (setting, threads, deterministic), group in sorted(groups.items()):
        forget = np.array([r["forget_acc"] for r in group])
        speed = np.array([r["speedup"] for r in group])
        classes = [r["forgotten_classes_test_acc"] for r in group if "forgotten_classes_test_acc" in r]
        certificates = ", ".join(f"{n}× {c}" for c, n in Counter(r["certificate"] for r in group).items())
        kernels = "deterministic" if deterministic else "default"
        worst_class = f"{max(classes):.3f}" if classes else "–"
        lines.append(f"| {setting} | {threads} | {kernels} | {len(group)} | {forget.mean():.3f} | {forget.min():.3f} "
                     f"| {forget.max():.3f} | {np.ptp(forget):.3f} | {worst_class} "
                     f"| {np.mean([r['test_acc'] for r in group]):.3f} | {speed.mean():.1f} | {speed.min():.1f} "
                     f"| {certificates} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="a workspace with the scenario prepared")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--request", required=True, help="a benchmark request SPEC, e.g. class:1,7")
    parser.add_argument("--method", required=True)
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 … N−1")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--options", default="{}", help="the method's settings (JSON)")
    parser.add_argument("--compare", default=None, help="a second setting, run on the same originals (JSON)")
    parser.add_argument("--out", type=Path, default=None, help="write every run here (JSON)")
    args = parser.parse_args(argv)
    settings = {"default" if args.options == "{}" else args.options: json.loads(args.options)}
    if args.compare is not None:
        settings[args.compare] = {**json.loads(args.options), **json.loads(args.compare)}
    runs, start = [], time.perf_counter()
    for seed in range(args.seeds):
        for threads in (int(t) for t in args.threads.split(",")):
            runs += one_seed(args, seed, threads, settings)
            print(f"seed {seed}, {threads} thread(s): " + ", ".join(
                f"{r['setting']}/{'det' if r['deterministic'] else 'default'} {r['forget_acc']:.3f}"
                for r in runs[-2 * len(settings):]), f"({time.perf_counter() - start:.0f} s)", file=sys.stderr,
                flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(runs, indent=1))
    print(table(runs))


if __name__ == "__main__":
    main()
