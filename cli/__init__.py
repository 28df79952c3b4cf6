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


# The libraries' console logging in quiet mode (the default), each through its own public setting.
# Prefect's console handler is the root logger's: at WARNING it drops every library's INFO line
# (GX pins some of its loggers to INFO), while Prefect's API handler still takes the flow runs' INFO
# lines, so the UI shows the run logs the terminal leaves out. MLflow logs through its own handler.
QUIET_SETTINGS = {"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING", "MLFLOW_LOGGING_LEVEL": "WARNING"}
VERBOSE_SETTINGS = {"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "NOTSET", "MLFLOW_LOGGING_LEVEL": "INFO"}


def configure_output(verbose: bool) -> None:
    """Quiet by default: the libraries' INFO lines and deprecation warnings stay off the console, the
    command prints its own lines from the flows' results. ``--verbose`` brings the libraries' logs
    back (Prefect's flow-run log with the round-by-round training lines among them). Set before the
    libraries are imported: each reads its setting when it configures its logging. A setting the
    user exported is kept in quiet mode; ``--verbose`` overrides it."""
    if verbose:
        os.environ.update(VERBOSE_SETTINGS)
        return
    from cli.common import silence_library_deprecations

    for name, value in QUIET_SETTINGS.items():
        os.environ.setdefault(name, value)
    silence_library_deprecations()


# Commands a data subject runs without a workspace, whose modules import no torch: they are parsed
# by a parser that registers only their own module, so that they start quickly.
LIGHT_COMMANDS = {"verify-receipt": "transparency"}


def command_of(argv: list[str]) -> str | None:
    """The sub-command named on the command line (the first argument that is not a global option)."""
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        if word == "--root":
            rest = rest[1:]
        elif not word.startswith("-"):
            return word
    return None


def build_parser(modules: tuple[str, ...] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedunlearn",
        description="Federated unlearning pipeline: DVC data versions, Prefect flows, MLflow registry.")
    parser.add_argument("--root", default=os.environ.get("FEDUNLEARN_ROOT", "."),
                        help="workspace holding params.yaml, dvc.yaml, data/ and mlflow/ (default: current "
                             "directory or $FEDUNLEARN_ROOT)")
    parser.add_argument("--verbose", action="store_true",
                        help="show the libraries' logs (Prefect, MLflow, DVC, Great Expectations), the flow runs' "
                             "round-by-round lines among them; also accepted after the command")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress of the long steps (training rounds, audit references, a batch's "
                             "attempts) on stderr: the command's own lines only; also accepted after the command")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in modules:
        importlib.import_module(f"cli.{name}").register(sub)
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line, ``--verbose`` accepted after the command as well as before it."""
    light = LIGHT_COMMANDS.get(command_of(sys.argv[1:] if argv is None else argv) or "")
    parser = build_parser((light,) if light else COMMAND_MODULES)
    args, extra = parser.parse_known_args(argv)
    for flag in ("--verbose", "--quiet"):
        if flag in extra:
            setattr(args, flag[2:], True)
            extra = [arg for arg in extra if arg != flag]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    root = workspace_root(args)
    if getattr(args, "needs_workspace", True) and not (root / "params.yaml").is_file():
        print(f"error: {root} has no params.yaml, so it is not a workspace; create one with `fedunlearn init {root}`, "
              "or run from the project root or pass --root", file=sys.stderr)
        return 2
    configure_environment(root)
    configure_output(args.verbose)
    # A full disk that does not say so (torch's writer, SQLite, the Prefect server's HTTP 500) is
    # confirmed against the filesystems this command writes to.
    watch_filesystems(root, os.environ.get("PREFECT_HOME"), tempfile.gettempdir())
    from cli.common import end_command, leave_when_own_server_exits

    command = "`fedunlearn " + shlex.join(sys.argv[1:] if argv is None else argv) + "`"
    if argv is None:
        leave_when_own_server_exits(command, root)
    try:
        try:
            with progress_shown(args):
                code = int(args.handler(args, root) or 0)
            sys.stdout.flush()  # a reader that closed the pipe is found here, not at the interpreter's exit
            return code
        finally:
            end_command()
    except BrokenPipeError:
        return reader_gone()
    except Exception as err:
        return report_error(err, command, root, leave_at_once=argv is None)


def progress_shown(args: argparse.Namespace):
    """The long steps' progress on stderr while the command runs (``cli.progress``); none with
    ``--quiet``. With ``--verbose`` a line a step, never redrawn over the libraries' log lines."""
    import contextlib

    if args.quiet:
        return contextlib.nullcontext()
    from cli.progress import shown

    return shown(tty=False if args.verbose else None)


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what `yes | head -1` reports for yes


def reader_gone() -> int:
    """Whoever read our output closed it (``fedunlearn ids | head -3``): nothing is wrong, and no server was
    lost. What is left in the buffer goes to /dev/null, so that the interpreter's exit does not print
    the same error again (Python's documentation, "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return SIGPIPE_EXIT


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
