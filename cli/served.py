"""``fedunlearn served copy-runs|announce|withdraw``: what `make serve` (scripts/serve.sh) does around
its Prefect server — the CLI's runs copied into it (``runtime.run_history``), and the marker that
sends the workspace's CLI commands to it while it runs (``runtime.served``). docs/serving.md,
"The CLI's runs in the served UI"."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    served = sub.add_parser("served", help="make serve's steps: copy the CLI's runs into its Prefect server; its marker",
                            description="What `make serve` runs around its Prefect server: `copy-runs` brings the "
                                        "flow runs the CLI recorded in the workspace's Prefect home (.prefect/) into "
                                        "the server in PREFECT_API_URL; `announce` and `withdraw` write and remove "
                                        "the marker (.prefect/served.json) that sends the workspace's CLI commands "
                                        "to that server while it runs.")
    actions = served.add_subparsers(dest="action", required=True, metavar="ACTION")
    copy = actions.add_parser("copy-runs", help="copy the CLI's finished flow runs into the server in PREFECT_API_URL",
                              description="Copy every finished flow run the CLI recorded in the Prefect home's database "
                                          "(its task runs, artifacts and logs) into the Prefect server in "
                                          "PREFECT_API_URL, tagged from-cli; runs copied before are skipped. Nothing "
                                          "to do when that server uses the same database (make serve on SQLite), as "
                                          "its database setting says (PREFECT_API_DATABASE_CONNECTION_URL, which "
                                          "serve.sh exports; unset: the Prefect home's prefect.db).")
    copy.set_defaults(handler=run_copy)
    announce = actions.add_parser("announce", help="write the marker: the workspace is served at API_URL",
                                  description="Write the Prefect home's served.json: while process PID runs and the "
                                              "server answers, CLI commands of this workspace run their flows on it.")
    announce.add_argument("--api-url", required=True, help="the served Prefect server's API URL")
    announce.add_argument("--pid", type=int, required=True, help="the served Prefect server's process ID")
    announce.set_defaults(handler=run_announce)
    withdraw = actions.add_parser("withdraw", help="remove the marker written for PID",
                                  description="Remove the Prefect home's served.json if it names process PID.")
    withdraw.add_argument("--pid", type=int, required=True, help="the process ID the marker names")
    withdraw.set_defaults(handler=run_withdraw)


def prefect_home() -> Path:
    return Path(os.environ["PREFECT_HOME"]).expanduser()  # cli.configure_environment sets it


def run_copy(args: argparse.Namespace, root: Path) -> int:
    from runtime.run_history import copy_cli_runs

    target = os.environ.get("PREFECT_API_URL")
    if not target:
        raise ValueError("set PREFECT_API_URL to the served Prefect server (make serve does): the runs are copied "
                         "into it")
    print(copy_cli_runs(prefect_home(), target).line())
    return 0


def run_announce(args: argparse.Namespace, root: Path) -> int:
    from runtime.served import announce

    announce(prefect_home(), args.api_url, args.pid)
    return 0


def run_withdraw(args: argparse.Namespace, root: Path) -> int:
    from runtime.served import withdraw

    withdraw(prefect_home(), args.pid)
    return 0
