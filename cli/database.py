"""``fedunlearn db start|stop|url|status``: the workspace's PostgreSQL (``stores.postgres``) — the
Prefect server's database and the MLflow store of `make serve`. docs/serving.md, "Serving on
PostgreSQL"."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

DRIVERS = {"prefect": "asyncpg", "mlflow": "psycopg2"}  # Prefect's server is async; MLflow's store is not


def register(sub: argparse._SubParsersAction) -> None:
    db = sub.add_parser("db", help="the workspace's PostgreSQL for make serve: start, stop, url, status",
                        description="The PostgreSQL databases `make serve` runs the Prefect server and the MLflow "
                                    "tracking store on: `start` makes and starts the workspace's own cluster "
                                    "(.postgres/, 127.0.0.1, a free port) — or uses the server in DATABASE_URL — "
                                    "creates the databases prefect and mlflow and, the first time, copies the "
                                    "workspace's SQLite MLflow store into PostgreSQL; from then on every command "
                                    "uses that store. `stop` stops the workspace's own cluster.")
    actions = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start the workspace's PostgreSQL (make serve does)")
    start.add_argument("--shell", action="store_true",
                       help="print `export` lines for serve.sh: PREFECT_API_DATABASE_CONNECTION_URL, "
                            "MLFLOW_BACKEND_STORE_URI")
    start.set_defaults(handler=run_start)
    stop = actions.add_parser("stop", help="stop the workspace's own cluster (a DATABASE_URL server is left alone)")
    stop.set_defaults(handler=run_stop)
    url = actions.add_parser("url", help="the SQLAlchemy URL of a database (no password: ?passfile= names it)")
    url.add_argument("database", choices=sorted(DRIVERS), help="which database: %(choices)s")
    url.set_defaults(handler=run_url)
    status = actions.add_parser("status", help="where the workspace's databases are and whether they answer")
    status.set_defaults(handler=run_status)


def run_start(args: argparse.Namespace, root: Path) -> int:
    from stores import postgres

    server = postgres.start(root, os.environ.get("DATABASE_URL") or None)
    if args.shell:
        print(f"export PREFECT_API_DATABASE_CONNECTION_URL={shlex.quote(server.url('prefect', DRIVERS['prefect']))}")
        print(f"export MLFLOW_BACKEND_STORE_URI={shlex.quote(server.url('mlflow', DRIVERS['mlflow']))}")
    else:
        print(f"PostgreSQL for {root}: {server.display()} (databases {', '.join(postgres.DATABASES)})")
    return 0


def run_stop(args: argparse.Namespace, root: Path) -> int:
    from stores import postgres

    config = postgres.workspace_config(root)
    if config is None:
        print(f"{root} is not served on PostgreSQL: nothing to stop")
    elif config["server"] != "local":
        print(f"{root} keeps its databases on {config['server']}, which is not the workspace's to stop")
    else:
        print("stopped the workspace's PostgreSQL cluster" if postgres.stop(root) else "the cluster was not running")
    return 0


def run_url(args: argparse.Namespace, root: Path) -> int:
    from stores import postgres

    print(postgres.workspace_server(root, start=False).url(args.database, DRIVERS[args.database]))
    return 0


def run_status(args: argparse.Namespace, root: Path) -> int:
    from stores import postgres

    config = postgres.workspace_config(root)
    if config is None:
        print(f"{root} is not served on PostgreSQL: MLflow in mlflow/mlflow.db (`fedunlearn db start` moves it)")
        return 0
    try:
        server = postgres.workspace_server(root, start=False)
    except postgres.PostgresFailed as err:
        print(str(err))
        return 1
    postgres.connect(server, "mlflow").close()
    print(f"{server.display()} answers; databases {', '.join(postgres.DATABASES)}; MLflow store "
          f"{server.display('mlflow')}, artifacts in {root / 'mlflow' / 'artifacts'}")
    return 0
