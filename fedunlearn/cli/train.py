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

    demo = sub.add_parser("demo", help=f"prepare, partition and train {DEFAULT_SCENARIO}, then show the UIs",
                          description=f"The quick start: trains {DEFAULT_SCENARIO} end to end and prints how to "
                                      "open the MLflow and Prefect UIs on the result.")
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


def quiet_task_logs() -> None:
    """Per-task-run chatter would bury the per-round progress lines."""
    for name in ("prefect.task_runs", "great_expectations", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def train(args: argparse.Namespace, root: Path) -> dict:
    from flows.runners import make_task_runner
    from flows.train import train_federated
    from tasks.workspace import init_workspace

    if args.backdoor != bool(args.request):
        raise ValueError("--backdoor and --request go together: --backdoor --request client:largest")
    init_workspace(root)
    quiet_task_logs()
    flow = train_federated.with_options(task_runner=make_task_runner(args.runner, args.runner_address))
    return flow(scenario=args.scenario, root=str(root), rounds=args.rounds, local_epochs=args.local_epochs,
                client_tasks=not args.inline, device=args.device, backdoor_request=args.request)


def run_train(args: argparse.Namespace, root: Path) -> int:
    result = train(args, root)
    print(f"\n{result['scenario']}: test_acc={result['test_acc']:.4f}, data version {result['data_version']}, "
          f"registered version {result['model_version']} (alias 'original') in {result['wall_seconds']:.0f} s")
    return 0


def run_demo(args: argparse.Namespace, root: Path) -> int:
    defaults = build_defaults()
    result = train(defaults, root)
    from tasks.tracking import tracking_uri, use_store

    client = use_store(root)
    print(f"\n== {result['scenario']} trained: test_acc={result['test_acc']:.4f} "
          f"(data version {result['data_version']}, {result['wall_seconds']:.0f} s on {result['device']})")
    print("\nRegistered versions:")
    aliases = client.get_registered_model(result["scenario"]).aliases  # search results omit aliases
    for version in client.search_model_versions(f"name='{result['scenario']}'"):
        named = [alias for alias, number in aliases.items() if str(number) == str(version.version)]
        print(f"  {version.name} v{version.version}  aliases={named}  "
              f"role={version.tags.get('role')}  data_version={version.tags.get('data_version')}")
    print(f"""
Open the MLflow UI (registry, runs, per-round metrics):
  .venv/bin/mlflow ui --backend-store-uri {tracking_uri(root)} --host 127.0.0.1 --port 5000
  -> http://127.0.0.1:5000/#/models/{result['scenario']}
Open the Prefect UI (flow runs, task runs per client and round):
  PREFECT_HOME={root / '.prefect'} .venv/bin/prefect server start --host 127.0.0.1 --port 4200
  -> http://127.0.0.1:4200/runs
Sample IDs for a deletion request:
  .venv/bin/fedunlearn ids --scenario {result['scenario']} --client 0 --limit 5""")
    return 0


def build_defaults() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    return parser.parse_args([])
