"""``fedunlearn benchmark``: every method against retraining on one scenario and request."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedunlearn.benchmark.spec import REQUEST_FORMS, parse_request
from cli.common import DEFAULT_SCENARIO
from fedunlearn.device import DEVICE_CHOICES
from fedunlearn.errors import BenchmarkRegressed

REGRESSION_EXIT = BenchmarkRegressed.exit_code  # the run itself succeeded; a method got worse than the baseline


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "benchmark", help="compare unlearning methods with retraining on one request",
        description="Train (or reuse) the original model, retrain once without the forget data, run each method "
                    "from the same original, evaluate all (accuracies, |Δ| to retrain, membership inference, "
                    "backdoor, functional distance, cost) and write DIR/results.json, results.md, plots and "
                    "certificates; each row is logged as an MLflow run.")
    bench.add_argument("--scenario", default=DEFAULT_SCENARIO,
                       help="the scenario of params.yaml to benchmark on (default %(default)s)")
    bench.add_argument("--request", required=True, metavar="SPEC",
                       help=f"{REQUEST_FORMS}; 'largest' may stand for a client id")
    bench.add_argument("--methods", default="all", metavar="LIST",
                       help="comma-separated method names, or 'all' (every method supporting the setting and kind)")
    bench.add_argument("--out", default="results/benchmark", metavar="DIR", help="output directory")
    bench.add_argument("--backdoor", action="store_true",
                       help="put the 4×4 trigger with target label 0 on the forget samples before training")
    bench.add_argument("--device", choices=DEVICE_CHOICES, help="override params.yaml's device")
    bench.add_argument("--method-options", type=json.loads, default={}, metavar="JSON",
                       help='hyperparameters per method, e.g. \'{"ga": {"recovery_rounds": 0}}\'')
    bench.add_argument("--rounds", type=int, help="override the scenario's train.rounds (original, retrain, methods)")
    bench.add_argument("--local-epochs", type=int, help="override the scenario's train.local_epochs")
    bench.add_argument("--ulira", type=int, default=0, metavar="K",
                       help="add the per-example U-LiRA audit with K pairs of shadow federations per method "
                            "(costs 2K trainings per method: small scenarios only)")
    bench.add_argument("--compare", type=Path, metavar="OLD.json",
                       help="regression guard: compare with the results.json of an earlier run of the same scenario "
                            "and request; a method whose gap to retrain grew, whose speed-up fell or whose "
                            "certificate weakened is flagged, DIR/comparison.json written, and the exit status is "
                            f"{REGRESSION_EXIT}")
    bench.add_argument("--quality-tolerance", type=float, default=0.02, metavar="X",
                       help="with --compare: how much a gap to retrain may grow, absolute (default 0.02)")
    bench.add_argument("--speed-tolerance", type=float, default=0.25, metavar="X",
                       help="with --compare: how much a speed-up may fall, relative (default 0.25)")
    bench.set_defaults(handler=run_benchmark)


def run_benchmark(args: argparse.Namespace, root: Path) -> int:
    from cli.common import prepare_flow_run, require_methods, require_scenario

    # Input first, before the imports below (torch, Prefect) and any server: one line, exit 2.
    require_scenario(root, args.scenario)
    require_methods(root, args.scenario, methods=args.methods)
    spec = parse_request(args.request)
    out = Path(args.out) if Path(args.out).is_absolute() else Path.cwd() / args.out
    if out.exists() and not out.is_dir():  # found now, not after the minutes of training that write there
        from fedunlearn.errors import InputError

        raise InputError(f"--out {args.out} is a file: give a directory for the results (made if it does not exist)")
    from fedunlearn.benchmark.regression import compare, load_baseline, require_same_run
    from fedunlearn.benchmark.report import SUMMARY_KEYS, markdown_table
    from flows.benchmark import benchmark
    from stores.workspace import init_workspace

    baseline = load_baseline(args.compare) if args.compare else None
    if baseline is not None:  # a wrong baseline fails before any work
        require_same_run(baseline, args.scenario, spec.text)
    init_workspace(root)
    prepare_flow_run(args.verbose)
    # Minutes of training with nothing on the console otherwise (the flow's progress is on --verbose).
    print(f"benchmark of {args.scenario}, request {args.request}: the original model (trained unless reused), the "
          f"exact retrain and the methods {args.methods}, each evaluated and attacked"
          + (f", with {args.ulira} U-LiRA pairs of shadow federations each" if args.ulira else ""), flush=True)
    result = benchmark(scenario=args.scenario, request=args.request, methods=args.methods, out=str(out),
                     backdoor=args.backdoor, root=str(root), device=args.device, method_options=args.method_options,
                     ulira_pairs=args.ulira, rounds=args.rounds, local_epochs=args.local_epochs)
    print("\n" + markdown_table(result.rows, SUMMARY_KEYS))
    print(f"\nwrote {out}/results.json, results.md, plots and certificates/")
    if baseline is None:
        return 0
    comparison = compare(json.loads((out / "results.json").read_text()), baseline,
                         quality_tolerance=args.quality_tolerance, speed_tolerance=args.speed_tolerance)
    (out / "comparison.json").write_text(comparison.to_json())
    print("\n" + comparison.markdown())
    return REGRESSION_EXIT if comparison.regressions else 0
