"""``fedunlearn train`` and ``fedunlearn demo``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from cli.common import DEFAULT_SCENARIO, prepare_flow_run, require_scenario
from fedunlearn.benchmark.spec import parse_request
from fedunlearn.config import ScenarioConfig, load_params
from fedunlearn.device import DEVICE_CHOICES
from fedunlearn.runtime_choice import ENGINE_RUNNERS, TASK_RUNNERS, split_train_runner


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a federated model through Prefect and register it in MLflow",
                           description="Reproduce and validate the data, train the scenario's federated model "
                                       "(FedAvg, split-NN or D-PSGD) as a Prefect flow (client, party or node updates "
                                       "as task runs), log to MLflow and register the model with alias 'original'.")
    add_training_arguments(train)
    train.set_defaults(handler=run_train)

    demo = sub.add_parser("demo", help=f"the whole story (default {DEFAULT_SCENARIO}): train, delete, unlearn, compare",
                          description="The quick start: train and register the original, submit two example "
                                      "deletion requests, forget them in one batch on the interim tier (new data "
                                      "version, attempts gated, receipt with the exact-forgetting deadline), show "
                                      "the status, repay the debt with an exact retrain and print the registered "
                                      "versions side by side. Any scenario: mnist5k-hfl (make demo), mnist5k-vfl, "
                                      "mnist5k-dfl-ring, ...")
    demo.add_argument("--scenario", default=DEFAULT_SCENARIO, help="default %(default)s")
    demo.set_defaults(handler=run_demo)


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO, help="the scenario of params.yaml to train (default "
                        "%(default)s)")
    parser.add_argument("--rounds", type=int, help="override params.yaml's train.rounds")
    parser.add_argument("--local-epochs", type=int, help="override params.yaml's train.local_epochs")
    parser.add_argument("--device", choices=DEVICE_CHOICES, help="override params.yaml's device")
    parser.add_argument("--inline", action="store_true", help="run client updates inline, not as task runs")
    parser.add_argument("--runner", choices=[*TASK_RUNNERS, *ENGINE_RUNNERS],
                        help="the engine: in-process (default: the scenario's runner in params.yaml, else this), "
                             "flower (a local Flower deployment) or flower-simulation (HFL); or the in-process "
                             "engine's Prefect task runner for client updates: thread (default), dask, ray "
                             "(dask/ray need prefect-dask/prefect-ray)")
    parser.add_argument("--runner-address", help="address of an existing Dask scheduler or Ray cluster")
    parser.add_argument("--backdoor", action="store_true",
                        help="put the 4×4 trigger with target label 0 on the --request samples before training "
                             "(their IDs are kept with the version as backdoor_ids.txt)")
    parser.add_argument("--request", metavar="SPEC", help="with --backdoor: which samples carry the trigger "
                                                          "(benchmark SPEC, e.g. client:largest)")


def train(args: argparse.Namespace, root: Path) -> dict:
    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    if args.request:
        parse_request(args.request)  # a SPEC that does not parse: one line, exit 2
    from flows.task_runners import make_task_runner
    from flows.train import train_federated
    from stores.workspace import init_workspace

    if args.backdoor != bool(args.request):
        raise ValueError("--backdoor and --request go together: --backdoor --request client:largest")
    init_workspace(root)
    prepare_flow_run(args.verbose)
    task_runner, engine = split_train_runner(args.runner)
    flow = train_federated.with_options(task_runner=make_task_runner(task_runner, args.runner_address))
    return flow(scenario=args.scenario, root=str(root), rounds=args.rounds, local_epochs=args.local_epochs,
                client_tasks=not args.inline, device=args.device, backdoor_request=args.request,
                runner=engine.value if engine else None)


def run_train(args: argparse.Namespace, root: Path) -> int:
    cfg = load_params(root / "params.yaml").scenario(args.scenario)
    print(f"training {args.scenario} from scratch: {federated_rounds(cfg, args.rounds)}"
          + (" (--verbose shows each round)" if getattr(args, "quiet", False) and not args.verbose else ""), flush=True)
    result = train(args, root)
    poisoned = f"; backdoor on {result.backdoor_samples} samples" if result.backdoor_samples else ""
    print(f"\n{result.scenario}: test_acc={result.test_acc:.4f}, data version {result.data_version}, "
          f"registered version {result.model_version} (alias 'original', runtime {result.runtime}) in "
          f"{result.wall_seconds:.0f} s"
          f"{poisoned}")
    return 0


def run_demo(args: argparse.Namespace, root: Path) -> int:
    """The whole story on one scenario: train → deletion requests arrive → one batch forgets them on
    the interim tier (new data version, attempts gated, receipt with the exact deadline) → status
    says when exact forgetting is due → the debt repaid by an exact retrain → the registry side by
    side. Each long step is announced before it runs, with what it does."""
    require_scenario(root, args.scenario)  # before the imports: Prefect and torch take seconds
    from cli.common import describe_batch, erasure_line
    from cli.text import plain
    from fedunlearn.receipts import read_receipt
    from flows.debt import repay_retrain_debt
    from flows.process import process_deletions
    from tasks.receipts import comparison
    from tasks.status import deletion_status
    from stores.workspace import Workspace, init_workspace

    scenario = args.scenario
    steps = DemoSteps.of(init_workspace(root), scenario)
    print(f"== 1. {steps.training}", flush=True)
    trained = train(build_defaults(scenario, args.verbose), root)
    print(f"   registered v{trained.model_version} (alias 'original'): test_acc={trained.test_acc:.4f} on data "
          f"version {trained.data_version} in {trained.wall_seconds:.0f} s on {trained.device}")
    requests = submit_example_requests(root, scenario)
    print(f"\n== 2. deletion requests in data/deletion_requests/inbox/: {'; '.join(requests)}")
    print(f"\n== 3. {steps.batch}", flush=True)
    batch = process_deletions(scenario=scenario, root=str(root))
    print(f"   {batch.batch_id}: data version {batch.data_version_before} -> {batch.data_version_after}\n   "
          f"{erasure_line(batch.erasure)}\n   " + describe_batch(batch).replace("\n", "\n   "))
    ws = Workspace.open(root)
    print(f"\n== 4. fedunlearn status --scenario {scenario}:\n\n{plain(deletion_status(ws, scenario).markdown())}")
    owed = batch.forgetting == "interim"
    print(f"\n== 5. {steps.exact_retrain if owed else steps.nothing_owed}", flush=True)
    repaid = repay_retrain_debt(scenario=scenario, root=str(root)) if owed else None
    if repaid is not None:
        receipt = read_receipt(ws.root, batch.batch_id)
        print(f"   exact retrain v{repaid.version} serves (alias current)" if repaid.repaid else "   nothing owed")
        print(f"   receipt {batch.receipt}: {plain(receipt.tier_line())}")
        if repaid.retired:
            print(f"   {retired_line(scenario, repaid.retired)}")
    print(f"\n== 6. registered versions of {scenario} (fedunlearn compare --scenario {scenario}):\n")
    print(plain(comparison(ws, scenario)[1]))
    ids = f"$(.venv/bin/fedunlearn ids --scenario {scenario} --limit 5)"
    print(f"""
Next: `make serve` starts the Prefect UI (deployments; Run on process-deletions forgets new requests) and
the MLflow UI (registry: http://127.0.0.1:5000/#/models/{scenario}), both on 127.0.0.1. New requests:
  .venv/bin/fedunlearn request samples --scenario {scenario} --ids {ids}""")
    return 0


def retired_line(scenario: str, versions: list[str]) -> str:
    """What the demo's repayment retired, and why (docs/retirement.md)."""
    shown = ", ".join(f"v{v}" for v in versions)
    return (f"retired {shown}: they learnt the deleted samples, now forgotten exactly, so their weights were deleted "
            f"from every store; their records stay (step 6; in the MLflow UI each says RETIRED first), and "
            f"models:/{scenario}@current serves")


def federated_rounds(cfg: ScenarioConfig, rounds: int | None = None) -> str:
    """What training the scenario computes, e.g. "20 FedAvg rounds on 10 clients"."""
    algorithm, members = {"hfl": ("FedAvg", "clients"), "vfl": ("split-NN", "parties"),
                          "dfl": ("D-PSGD", "nodes")}[cfg.setting]
    return f"{rounds or cfg.train.rounds} {algorithm} rounds on {cfg.partition.num_clients} {members}"


@dataclass
class DemoSteps:
    """The demo's long steps as announced before each runs: what it does and why it takes time, with
    the scenario's own numbers from params.yaml."""

    training: str
    batch: str
    exact_retrain: str
    nothing_owed: str

    @classmethod
    def of(cls, root: Path, scenario: str) -> DemoSteps:
        from fedunlearn.unlearning.escalation import default_method

        params = load_params(root / "params.yaml")
        cfg, audit = params.scenario(scenario), params.audit
        rounds = federated_rounds(cfg)
        method = default_method(cfg.setting, "sample")
        return cls(
            training=f"training {scenario} from scratch: {rounds}, then registering it in MLflow (the longest "
                     "step with step 5; its rounds show on stderr, unless --quiet)",
            batch=f"one deletion batch forgets them: ledger and new data version (DVC), {method} unlearning, "
                  f"certificate, evaluation and per-example audit, gates, alias and receipt (a scenario's first "
                  f"batch also trains the audit's {audit.num_references} reference models, {audit.epochs} epochs "
                  "each on the held-out samples)",
            exact_retrain=f"exact retrain from scratch without the deleted samples ({rounds}, as long as step 1; "
                          f"fedunlearn repay-debt --scenario {scenario}): repays the retrain debt, so the requests "
                          "forgotten on the interim tier become exactly forgotten before their deadline; the versions "
                          "that learnt them then retire (weights deleted, records kept)",
            nothing_owed="no exact retrain owed: the batch's version forgot on the exact or formal tier")


def submit_example_requests(root: Path, scenario: str) -> list[str]:
    """Two requests as users would send them: 25 and 15 samples — each at one client in HFL/DFL
    (clients 0 and 1), from the shared samples in VFL."""
    from cli.data import sample_ids
    from fedunlearn.data.store import read_manifest
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import submit_request
    from fedunlearn.requests.model import build_request

    if read_manifest(scenario, root)["setting"] == "vfl":
        shared = sample_ids(root, scenario)
        chosen = [(shared[:25], "25 samples"), (shared[25:40], "15 samples")]
    else:
        chosen = [(sample_ids(root, scenario, c)[:n], f"{n} samples of client {c}") for c, n in ((0, 25), (1, 15))]
    folders = RequestFolders.create(root)
    submitted = []
    for ids, what in chosen:
        request = build_request({"kind": "sample", "sample_ids": ids, "scenario": scenario,
                                 "reason": f"demo: a user asked for {what} to be forgotten"})
        submitted.append(f"{submit_request(folders, request).stem} ({what})")
    return submitted


def build_defaults(scenario: str = DEFAULT_SCENARIO, verbose: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    defaults = parser.parse_args(["--scenario", scenario])
    defaults.verbose = verbose
    return defaults
