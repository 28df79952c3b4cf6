"""The ``fedunlearn`` command line: the top layer (cli → flows → tasks → core → models). Each
sub-module registers its own sub-commands. A command imports the flows and tasks it runs when it
runs (Prefect, MLflow and torch take seconds to import), so ``--help`` and ``request`` stay quick.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from fedunlearn.errors import FedunlearnError, as_no_space, watch_filesystems

COMMAND_MODULES = ("data", "train", "benchmark", "requests", "ledger", "pipeline", "durable", "database",
                   "transparency", "served")


def workspace_root(args: argparse.Namespace) -> Path:
    return Path(args.root).resolve()


def configure_environment(root: Path) -> None:
    """Keep Prefect's state inside the workspace unless the user chose otherwise."""
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
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
    # A full disk that does not say so (torch's writer, SQLite, the Prefect server's HTTP 500) is
    # confirmed against the filesystems this command writes to.
    watch_filesystems(root, os.environ.get("PREFECT_HOME"), tempfile.gettempdir())
    from cli.common import end_command

    try:
        try:
            return int(args.handler(args, root) or 0)
        finally:
            end_command()
    except Exception as err:
        return report_error(err, "`fedunlearn " + shlex.join(sys.argv[1:] if argv is None else argv) + "`", root,
                            leave_at_once=argv is None)


def leave_now(code: int) -> NoReturn:
    """End the process without the interpreter's shutdown. Once the Prefect server is gone, Prefect's log
    and event workers would spend minutes at exit retrying it, printing each failure after the command's
    error line; nothing they hold can be delivered. The command's own servers are stopped already."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def report_error(err: Exception, command: str, root: Path, leave_at_once: bool = False) -> int:
    """``error: <message>`` and the exit status of its meaning (``fedunlearn.errors``). A full disk
    anywhere in the error's chain — a flow's wrapped error, the Prefect server's HTTP 500 — is
    ``NoSpace``, whatever else it was wrapped in."""
    full = as_no_space(err, command, root)
    if full is not None:
        print(f"error: {full}", file=sys.stderr)
        return full.exit_code
    from cli.common import lost_service

    lost = lost_service(err, command, root)
    if lost is not None:  # a server went away: one line naming it and the fix, not its traceback
        print(f"error: {lost}", file=sys.stderr)
        if lost.prefect_gone and leave_at_once:  # the real command line only: tests call main() in-process
            leave_now(lost.exit_code)
        return lost.exit_code
    if isinstance(err, FedunlearnError):  # each meaning its exit status
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    if isinstance(err, (ValueError, FileNotFoundError)):
        print(f"error: {err}", file=sys.stderr)
        return 2
    raise err
