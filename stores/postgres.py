"""PostgreSQL for `make serve`: the Prefect server's database and the MLflow tracking store.

SQLite takes one writer at a time: under a served batch the Prefect server's services met
"database is locked", and events that failed three times went to its dead-letter queue (the
automations never counted them). A workspace served on PostgreSQL (``fedunlearn db start``, which
`make serve` runs) records it in ``.postgres/workspace.json``; its two databases, ``prefect`` and
``mlflow``, live either

* in a cluster of its own — ``.postgres/data``, made by ``initdb`` on the first start, run by
  ``pg_ctl`` on 127.0.0.1 and a free port, no Unix socket, password (SCRAM) authentication only;
  the password is in ``.postgres/pgpass`` (mode 600), which every connection URL names
  (``?passfile=``) so no password is ever on a command line — or
* on the server ``DATABASE_URL`` named when the workspace was first served (its password, if any,
  goes to ``.postgres/pgpass`` too).

From then on the workspace's MLflow store is the ``mlflow`` database, its artifacts where they
always were (``mlflow/artifacts``): the served flows reach it through the MLflow tracking server
`make serve` starts (``FEDUNLEARN_MLFLOW_TRACKING_URI``), any other command directly — starting
the workspace's own cluster when it is not running (``fedunlearn db stop`` stops it). A SQLite
store the workspace already has (``mlflow/mlflow.db``, e.g. after `make demo`) is copied into the
database on that first start, table by table, and kept as ``mlflow/mlflow.db.moved-to-postgres``.

When a user runs it as root (a container), the cluster runs as the unprivileged user ``postgres``
(Debian's package creates it; ``POSTGRES_USER`` names another): PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, unquote, urlparse

from fedunlearn.errors import InputError

PG_DIR = Path(".postgres")
ROLE = "fedunlearn"
DATABASES = ("prefect", "mlflow")
SERVED_TRACKING_ENV = "FEDUNLEARN_MLFLOW_TRACKING_URI"  # make serve: the MLflow server of this workspace
MOVED_SQLITE = "mlflow.db.moved-to-postgres"
BINARIES = ("initdb", "pg_ctl", "postgres")
START_TIMEOUT_S = 60


class PostgresMissing(InputError):
    """No PostgreSQL server binaries on this machine."""


class PostgresFailed(InputError):
    """initdb, pg_ctl or a connection failed: the message names what and the log to read."""


def binaries() -> Path:
    """The directory of initdb, pg_ctl and postgres: ``POSTGRES_BIN``, then Debian's
    /usr/lib/postgresql/<newest>/bin, then the PATH."""
    candidates = [os.environ["POSTGRES_BIN"]] if os.environ.get("POSTGRES_BIN") else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    candidates += glob.glob("/usr/local/pgsql/bin")
    on_path = shutil.which("pg_ctl")
    candidates += [str(Path(on_path).resolve().parent)] if on_path else []
    for candidate in candidates:
        if all((Path(candidate) / name).is_file() for name in BINARIES):
            return Path(candidate)
    raise PostgresMissing("PostgreSQL's server binaries (initdb, pg_ctl, postgres) are not on this machine: install "
                          "them with scripts/install-postgres.sh (apt-get install postgresql), or set POSTGRES_BIN to "
                          "the directory holding them — or serve on SQLite: SERVE_DB=sqlite make serve")


def _version(path: str) -> tuple[int, ...]:
    name = Path(path).parent.name
    return tuple(int(part) for part in name.split(".") if part.isdigit()) or (0,)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- a cluster owned by one directory --------------------------------------------------------------

class LocalCluster:
    """A PostgreSQL cluster in ``directory`` (``data/``, ``server.log``, ``pgpass``): made, started on
    127.0.0.1 and a free port, stopped. Only this machine's loopback reaches it, with the password."""

    def __init__(self, directory: Path):
        self.directory = Path(directory).resolve()
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.pgpass = self.directory / "pgpass"

    @property
    def initialized(self) -> bool:
        return (self.data / "PG_VERSION").is_file()

    def port(self) -> int | None:
        """The port of the running server, None when it does not run (``postmaster.pid``: its first line
        the server's PID, the fourth its port)."""
        try:
            lines = (self.data / "postmaster.pid").read_text(errors="replace").splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # a stale file: the server was killed
        except PermissionError:
            pass  # it runs, as another user
        return port

    def init(self) -> None:
        """``initdb``: superuser ``fedunlearn`` with a new random password, SCRAM on every connection."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        password = secrets.token_urlsafe(24)
        write_private(self.pgpass, f"127.0.0.1:*:*:{ROLE}:{password}\nlocalhost:*:*:{ROLE}:{password}\n")
        if self.data.exists():  # no PG_VERSION: an initdb that did not finish, which initdb would refuse
            shutil.rmtree(self.data)
        self.data.mkdir(mode=0o700)
        pwfile = self.directory / ".initdb-password"
        write_private(pwfile, password + "\n")
        self.log.touch()
        owner = _run_as()
        for path in (self.directory, self.data, pwfile, self.log):
            if owner is not None:
                os.chown(path, owner.pw_uid, owner.pw_gid)
        self._check_reachable(owner)
        try:
            self._run([str(binaries() / "initdb"), "-D", str(self.data), "-U", ROLE, f"--pwfile={pwfile}",
                       "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale"],
                      "initdb")
        finally:
            pwfile.unlink(missing_ok=True)
        with open(self.data / "postgresql.conf", "a") as conf:
            # Loopback only, and no Unix socket: its path would be too long inside a deep workspace.
            conf.write("\n# fedunlearn\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n")

    def start(self) -> int:
        """Start the cluster (made first if needed) on a free port, or return the port it runs on."""
        if not self.initialized:
            self.init()
        running = self.port()
        if running is not None:
            return running
        port = free_port()
        try:
            self._run([str(binaries() / "pg_ctl"), "start", "-w", "-t", str(START_TIMEOUT_S), "-D", str(self.data),
                       "-l", str(self.log), "-o", f"-p {port}"], "pg_ctl start")
        except PostgresFailed:
            running = self.port()  # another command started it at the same moment
            if running is None:
                raise
            return running
        return port

    def stop(self) -> bool:
        """Stop the cluster if it runs (fast: open sessions are ended). True when it ran."""
        if not self.initialized or self.port() is None:
            return False
        self._run([str(binaries() / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data)], "pg_ctl stop")
        return True

    def _check_reachable(self, owner: pwd.struct_passwd | None) -> None:
        """The unprivileged user the cluster runs as (for root) must be able to reach its directory."""
        if owner is None:
            return
        probe = subprocess.run(self._as_owner(["test", "-w", str(self.data)]), capture_output=True, check=False)
        if probe.returncode != 0:
            raise PostgresFailed(f"PostgreSQL does not run as root, so its cluster runs as the user {owner.pw_name}, "
                                 f"who cannot reach {self.directory}: give the workspace's parent directories search "
                                 f"permission (chmod o+x on each of them), run as an unprivileged user, or set "
                                 "DATABASE_URL to a PostgreSQL server")

    def _as_owner(self, args: list[str]) -> list[str]:
        owner = _run_as()
        return ["runuser", "-u", owner.pw_name, "--", *args] if owner is not None else args

    def _run(self, args: list[str], what: str) -> None:
        done = subprocess.run(self._as_owner(args), capture_output=True, text=True, check=False,
                              cwd=self.directory)
        if done.returncode != 0:
            raise PostgresFailed(f"{what} for the PostgreSQL cluster in {self.directory} failed (exit "
                                 f"{done.returncode}): {(done.stderr or done.stdout).strip()[-1500:]}\nsee also "
                                 f"{self.log}")


def _run_as() -> pwd.struct_passwd | None:
    """Who runs the cluster's programs: this user, or — for root — an unprivileged one."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("POSTGRES_USER", "postgres")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise PostgresFailed(f"PostgreSQL does not run as root, and there is no user {name!r} to run it as: create "
                             "one (Debian's postgresql package creates 'postgres') or set POSTGRES_USER") from None


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)


# --- where a workspace's databases are --------------------------------------------------------------

@dataclass
class Server:
    """A PostgreSQL server as the workspace reaches it (no password: ``passfile`` holds it)."""

    host: str
    port: int
    user: str
    passfile: Path
    maintenance: str = "postgres"  # the database to connect to when creating the others

    def url(self, database: str, driver: str = "psycopg2") -> str:
        """SQLAlchemy URL of ``database``: ``psycopg2`` for MLflow, ``asyncpg`` for Prefect."""
        return (f"postgresql+{driver}://{quote(self.user, safe='')}@{self.host}:{self.port}/{database}"
                f"?passfile={quote(str(self.passfile))}")

    def dsn(self, database: str) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={database} passfile={self.passfile}"

    def display(self, database: str = "") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"


def marker(root: Path) -> Path:
    return Path(root) / PG_DIR / "workspace.json"


def workspace_config(root: Path) -> dict | None:
    """What ``.postgres/workspace.json`` records — None: the workspace is not on PostgreSQL."""
    path = marker(root)
    return json.loads(path.read_text()) if path.is_file() else None


def workspace_server(root: Path, start: bool = True) -> Server:
    """The workspace's server; its own cluster is started when it does not run (``start``) — or a
    ``PostgresFailed`` says how to start it."""
    config = workspace_config(root)
    if config is None:
        raise PostgresFailed(f"{root} is not served on PostgreSQL (no {PG_DIR}/workspace.json): `fedunlearn db start`")
    cluster = LocalCluster(Path(root) / PG_DIR)
    if config.get("server") == "local":
        port = cluster.port()
        if port is None:
            if not start:
                raise PostgresFailed(f"the workspace's PostgreSQL cluster ({cluster.directory}) is not running: "
                                     f"`fedunlearn --root {root} db start` starts it (make serve does)")
            port = cluster.start()
            print(f"started the workspace's PostgreSQL cluster ({cluster.directory}) on 127.0.0.1:{port}; "
                  f"`fedunlearn --root {root} db stop` stops it", file=sys.stderr)
        return Server("127.0.0.1", port, ROLE, cluster.pgpass)
    parsed = urlparse(config["server"])
    return Server(parsed.hostname or "127.0.0.1", parsed.port or 5432, unquote(parsed.username or ROLE),
                  cluster.pgpass, (parsed.path or "/postgres").lstrip("/") or "postgres")


def _external(database_url: str, pgpass: Path) -> tuple[Server, str]:
    """``DATABASE_URL`` as a Server (its password moved to ``pgpass``) and as recorded (no password)."""
    parsed = urlparse(database_url)
    if parsed.scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise InputError(f"DATABASE_URL must be a postgresql:// URL (postgresql://USER:PASSWORD@HOST:PORT/DB), "
                         f"not {parsed.scheme}://...")
    host, port, user = parsed.hostname or "127.0.0.1", parsed.port or 5432, unquote(parsed.username or ROLE)
    if parsed.password:
        write_private(pgpass, f"{host}:{port}:*:{user}:{unquote(parsed.password)}\n")
    elif not pgpass.exists():
        write_private(pgpass, "")
    database = (parsed.path or "").lstrip("/") or "postgres"
    return Server(host, port, user, pgpass, database), f"postgresql://{quote(user, safe='')}@{host}:{port}/{database}"


def start(root: Path, database_url: str | None = None) -> Server:
    """``fedunlearn db start``: the workspace's server running (its own cluster, or ``database_url``),
    its two databases there, its SQLite MLflow store moved in on the first start; recorded."""
    root = Path(root).resolve()
    config = workspace_config(root) or {}
    directory = root / PG_DIR
    if database_url:
        server, recorded = _external(database_url, directory / "pgpass")
        if config and config.get("server") != recorded:
            raise InputError(f"{root} keeps its databases on {config['server']} ({marker(root)}), not on DATABASE_URL "
                             f"{recorded}: unset DATABASE_URL, or serve a new workspace (`fedunlearn init`) there")
        config = {"server": recorded}
    else:
        if not config:
            config = {"server": "local"}
        if config["server"] == "local":
            LocalCluster(directory).start()
        server = None
    write_private(marker(root), json.dumps(config, indent=2) + "\n")
    server = server or workspace_server(root)
    create_databases(server)
    move_sqlite_store(root, server)
    return server


def stop(root: Path) -> bool:
    """``fedunlearn db stop``: the workspace's own cluster stopped (a DATABASE_URL server is not ours)."""
    config = workspace_config(root)
    return bool(config and config.get("server") == "local" and LocalCluster(Path(root) / PG_DIR).stop())


def connect(server: Server, database: str):
    import psycopg2

    try:
        return psycopg2.connect(server.dsn(database), connect_timeout=10)
    except psycopg2.Error as err:
        raise PostgresFailed(f"cannot connect to {server.display(database)}: {str(err).strip()}") from err


def create_databases(server: Server, names: tuple[str, ...] = DATABASES) -> None:
    """The databases ``names`` on ``server``, created where missing."""
    connection = connect(server, server.maintenance)
    connection.autocommit = True  # CREATE DATABASE runs outside a transaction
    try:
        with connection.cursor() as cursor:
            for name in names:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{name}"')
    except Exception as err:
        raise PostgresFailed(f"could not create the databases {', '.join(names)} on {server.display()}: {err}; "
                             "create them (owned by that user) and start again") from err
    finally:
        connection.close()


# --- MLflow ---------------------------------------------------------------------------------------

def mlflow_tracking_uri(root: Path) -> str | None:
    """The workspace's MLflow store when it is on PostgreSQL — the tracking server `make serve` runs
    for it (``FEDUNLEARN_MLFLOW_TRACKING_URI``), else the ``mlflow`` database itself; None otherwise."""
    if workspace_config(root) is None:
        return None
    return os.environ.get(SERVED_TRACKING_ENV) or workspace_server(root).url("mlflow")


def serves_workspace_store(root: Path, uri: str) -> bool:
    """``uri`` is the tracking server `make serve` runs over this workspace's own store (its artifacts
    in this workspace's mlflow/artifacts), not a server elsewhere."""
    return workspace_config(root) is not None and uri == os.environ.get(SERVED_TRACKING_ENV)


def move_sqlite_store(root: Path, server: Server) -> None:
    """Copy the workspace's SQLite MLflow store into the ``mlflow`` database (once: it is then kept as
    ``mlflow/mlflow.db.moved-to-postgres``). Refused when the database already holds runs."""
    sqlite = Path(root) / "mlflow" / "mlflow.db"
    if not sqlite.is_file():
        return
    from stores.mlflow_move import copy_mlflow_store

    counts = copy_mlflow_store(f"sqlite:///{sqlite}", server.url("mlflow"))
    sqlite.rename(sqlite.with_name(MOVED_SQLITE))
    print(f"moved the MLflow store {sqlite} into {server.display('mlflow')} ({counts.get('runs', 0)} runs, "
          f"{counts.get('model_versions', 0)} model versions); the SQLite file is kept as {MOVED_SQLITE}",
          file=sys.stderr)


# --- the erasure scan --------------------------------------------------------------------------------

def table_contents(server: Server, database: str, chunk_bytes: int = 16 << 20) -> Iterator[tuple[str, bytes]]:
    """Every row of every table of ``database`` as text (one line per row, PostgreSQL's own text form
    of it: numbers as written, JSON as stored), in chunks of whole rows; ``bytea`` columns also as
    their raw bytes. Read through a server-side cursor: a large table never sits in memory whole."""
    connection = connect(server, database)
    try:
        connection.set_session(readonly=True)
        for schema, table, binary in _tables(connection):
            name = f"{database}/{schema}.{table}"
            yield from _chunks(connection, name, f'SELECT t::text FROM "{schema}"."{table}" t', chunk_bytes)
            for column in binary:
                yield from _chunks(connection, f"{name}.{column}",
                                   f'SELECT "{column}" FROM "{schema}"."{table}" WHERE "{column}" IS NOT NULL',
                                   chunk_bytes)
    finally:
        connection.close()


def _tables(connection) -> list[tuple[str, str, list[str]]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
                       "AND table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2")
        tables = cursor.fetchall()
        cursor.execute("SELECT table_schema, table_name, column_name FROM information_schema.columns "
                       "WHERE data_type = 'bytea' AND table_schema NOT IN ('pg_catalog', 'information_schema')")
        binary: dict[tuple[str, str], list[str]] = {}
        for schema, table, column in cursor.fetchall():
            binary.setdefault((schema, table), []).append(column)
    return [(schema, table, sorted(binary.get((schema, table), []))) for schema, table in tables]


def _chunks(connection, name: str, query: str, chunk_bytes: int) -> Iterator[tuple[str, bytes]]:
    with connection.cursor(name=f"scan_{secrets.token_hex(4)}") as cursor:
        cursor.itersize = 2000
        cursor.execute(query)
        parts, size, part = [], 0, 0
        for (value,) in cursor:
            data = bytes(value) if isinstance(value, memoryview) else str(value).encode()
            parts.append(data)
            size += len(data) + 1
            if size >= chunk_bytes:
                yield f"{name}#{part}", b"\n".join(parts)
                parts, size, part = [], 0, part + 1
        if parts or part == 0:
            yield f"{name}#{part}", b"\n".join(parts)
    connection.rollback()  # ends the read transaction the named cursor opened


def unreadable_tables(server: Server, database: str) -> list[str]:
    """The tables of ``database`` this user may not read (the scan would fail on them)."""
    connection = connect(server, database)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT table_schema || '.' || table_name FROM information_schema.tables "
                           "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema') "
                           "AND NOT has_table_privilege(quote_ident(table_schema) || '.' || quote_ident(table_name), "
                           "'SELECT')")
            return [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()
