"""``fedunlearn train`` and ``fedunlearn demo``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from fedunlearn.cli.data import DEFAULT_SCENARIO
from fedunlearn.device import DEVICE_CHOICES


def register(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train a federated model through Prefect and register it in MLflow",
                           description="Reproduce and validate the data, run FedAvg as a Prefect flow (client "
                                       "updates as task runs), log to MLflow and register the model with alias "
                                       "'original'.")
    add_training_arguments(train)
    train.set_defaults(handler=run_train)

    demo = sub.add_parser("demo", help=f"the whole story on {DEFAULT_SCENARIO}: train, delete, unlearn, compare",
                          description=f"The quick start on {DEFAULT_SCENARIO}: train and register the original, "
                                      "submit two example deletion requests, forget them in one batch (new data "
                                      "version, unlearned and retrained versions, gates, receipt) and print the "
                                      "registered versions side by side.")
    demo.add_argument("--scenario", default=DEFAULT_SCENARIO, help="an HFL scenario (default %(default)s)")
    demo.set_defaults(handler=run_demo)


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", default=DEFAULT_SCENARIO)
    parser.add_argument("--rounds", type=int, help="override params.yaml's train.rounds")
    parser.add_argument("--local-epochs", type=int, help="override params.yaml's train.local_epochs")
    parser.add_argument("--device", choices=DEVICE_CHOICES, help="override params.yaml's device")
    parser.add_argument("--inline", action="store_true", help="run client updates inline, not as task runs")
    parser.add_argument("--runner", choices=["thread", "dask", "ray"], default="thread",
                        help="Prefect task runner for client updates (dask/ray need prefect-dask/prefect-ray)")
    parser.add_argument("--runner-address", help="address of an existing Dask scheduler or Ray cluster")
    parser.add_argument("--backdoor", action="store_true",
                        help="put the 4×4 trigger with target label 0 on the --request samples before training")
    parser.add_argument("--request", metavar="SPEC", help="with --backdoor: which samples carry the trigger "
                                                          "(benchmark SPEC, e.g. client:largest)")


def prepare_flow_run() -> None:
    """Before a command runs a flow: per-task-run chatter would bury the per-round progress lines,
    and Prefect's ephemeral server (if no PREFECT_API_URL is set) must die with this process."""
    from tasks.ephemeral_server import install

    for name in ("prefect.task_runs", "great_expectations", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    install()


def train(args: argparse.Namespace, root: Path) -> dict:
    from flows.runners import make_task_runner
    from flows.train import train_federated
    from tasks.workspace import init_workspace

    if args.backdoor != bool(args.request):
        raise ValueError("--backdoor and --request go together: --backdoor --request client:largest")
    init_workspace(root)
    prepare_flow_run()
    flow = train_federated.with_options(task_runner=make_task_runner(args.runner, args.runner_address))
    return flow(scenario=args.scenario, root=str(root), rounds=args.rounds, local_epochs=args.local_epochs,
                client_tasks=not args.inline, device=args.device, backdoor_request=args.request)


def run_train(args: argparse.Namespace, root: Path) -> int:
    result = train(args, root)
    print(f"\n{result['scenario']}: test_acc={result['test_acc']:.4f}, data version {result['data_version']}, "
          f"registered version {result['model_version']} (alias 'original') in {result['wall_seconds']:.0f} s")
    return 0


def run_demo(args: argparse.Namespace, root: Path) -> int:
    """The whole story on the demo scenario: train → deletion requests arrive → one batch forgets
    them (new data version, unlearned and retrained versions, gates, receipt) → the registry
    side by side."""
    from fedunlearn.cli.pipeline import comparison, describe_batch
    from flows.process import process_deletions

    trained = train(build_defaults(args.scenario), root)
    scenario = trained["scenario"]
    print(f"\n== 1. {scenario} trained: test_acc={trained['test_acc']:.4f}, registered v{trained['model_version']} "
          f"(alias 'original') on data version {trained['data_version']} in {trained['wall_seconds']:.0f} s "
          f"on {trained['device']}")
    requests = submit_example_requests(root, scenario)
    print(f"\n== 2. deletion requests in data/deletion_requests/inbox/: {'; '.join(requests)}")
    batch = process_deletions(scenario=scenario, root=str(root), retrain_reference=True)
    print(f"\n== 3. batch {batch['batch_id']}: data version {batch['data_version_before']} -> "
          f"{batch['data_version_after']}\n   {describe_batch(batch)}")
    print(f"\n== 4. registered versions of {scenario} (fedunlearn compare --scenario {scenario}):\n")
    print(comparison(root, scenario))
    ids = f"$(.venv/bin/fedunlearn ids --scenario {scenario} --limit 5)"
    print(f"""
Next: `make serve` starts the Prefect UI (deployments; Run on process-deletions forgets new requests) and
the MLflow UI (registry: http://127.0.0.1:5000/#/models/{scenario}), both on 127.0.0.1. New requests:
  .venv/bin/fedunlearn request samples --scenario {scenario} --ids {ids}""")
    return 0


def submit_example_requests(root: Path, scenario: str) -> list[str]:
    """Two requests as users would send them, each for some of their samples at one client."""
    from fedunlearn.data.store import load_horizontal
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import submit_request
    from fedunlearn.requests.model import build_request

    clients = load_horizontal(scenario, root).clients
    examples = [({"kind": "sample", "sample_ids": clients[c].sample_ids[:n].tolist(),
                  "reason": f"demo: a user asked for {n} samples to be forgotten"}, f"{n} samples of client {c}")
                for c, n in ((0, 25), (1, 15))]
    folders = RequestFolders.create(root)
    return [f"{submit_request(folders, build_request({**fields, 'scenario': scenario})).stem} ({what})"
            for fields, what in examples]


def build_defaults(scenario: str = DEFAULT_SCENARIO) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    return parser.parse_args(["--scenario", scenario])
