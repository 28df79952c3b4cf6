"""The ``fedunlearn`` command line: the top layer (cli → flows → tasks → core → models). Each
sub-module registers its own sub-commands. A command imports the flows and tasks it runs when it
runs (Prefect, MLflow and torch take seconds to import), so ``--help`` and ``request`` stay quick.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from pathlib import Path

from fedunlearn.errors import FedunlearnError, NoSpace

COMMAND_MODULES = ("data", "train", "benchmark", "requests", "ledger", "pipeline", "durable")


def workspace_root(args: argparse.Namespace) -> Path:
    return Path(args.root).resolve()


def configure_environment(root: Path) -> None:
    """Keep Prefect's state inside the workspace unless the user chose otherwise."""
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # A new PREFECT_HOME creates and migrates its database on the first start: on a cold 2-core
    # machine that passed Prefect's 20 s default and the first `fedunlearn train` failed.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per weights file buries the log


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedunlearn",
        description="Federated unlearning pipeline: DVC data versions, Prefect flows, MLflow registry.")
    parser.add_argument("--root", default=os.environ.get("FEDUNLEARN_ROOT", "."),
                        help="workspace holding params.yaml, dvc.yaml, data/ and mlflow/ (default: current "
                             "directory or $FEDUNLEARN_ROOT)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = workspace_root(args)
    if getattr(args, "needs_workspace", True) and not (root / "params.yaml").is_file():
        print(f"error: {root} has no params.yaml, so it is not a workspace; create one with `fedunlearn init {root}`, "
              "or run from the project root or pass --root", file=sys.stderr)
        return 2
    configure_environment(root)
    try:
        return int(args.handler(args, root) or 0)
    except FedunlearnError as err:  # each meaning its exit status (fedunlearn.errors)
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        print(f"error: no space left on device ({err.filename or root}); free space on that filesystem and run the "
              f"same command again: a deletion batch resumes where it stopped", file=sys.stderr)
        return NoSpace.exit_code
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
