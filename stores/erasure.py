"""Every store the product writes, for the erasure scan: where it is on this machine and whether
a deletion batch can vouch for it.

    data               data/ (raw, partitions, ledger, requests, batch records) without receipts
    receipts           data/receipts/
    dvc-cache          .dvc/cache — earlier data versions stay until `ingest --purge` (then in scope)
    dvc-remote         the default DVC remote, when it is a local directory (in scope after a purge,
                       which also runs `dvc gc --cloud`)
    mlflow             the tracking database and every version's artifacts (mlflow/); with a tracking
                       server (params.yaml mlflow.tracking_uri) out of scope: the server keeps them
    prefect            Prefect's home: its database, result storage and logs (PREFECT_HOME)
    prefect-database   on PostgreSQL (make serve, ``stores.postgres``): the Prefect server's and the
    mlflow-database    MLflow store's databases, every row of every table read through a connection
                       (text, and bytea columns as bytes); out of scope, with the reason, when this
                       machine cannot connect or may not read a table
    postgres-cluster   the workspace's own cluster's files (.postgres/data): listed, not scanned — its
                       tables are scanned row by row above; a row deleted from a table stays in its
                       pages and the WAL, in PostgreSQL's binary page format, until vacuumed and recycled
    temporary files    .tmp/ (the CLI's TMPDIR) and .dvc/tmp/
    benchmark outputs  artifacts/ (cached originals) and results/

A store this machine cannot read (an S3 remote, a remote Prefect or MLflow server) is listed out of
scope with the reason: the report never vouches for what it did not scan.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from fedunlearn.requests.erasure import Store

TEMPORARY_DIR = Path(".tmp")
CACHE_DIR = Path(".cache")  # models kept between batches (the evaluator's shadow model)
PURGE_NOTE = "keeps earlier data versions (deleted rows included) until `fedunlearn ingest --purge`"


def dvc_remote(root: Path) -> tuple[str, str] | None:
    """The default DVC remote (name, url) from .dvc/config and .dvc/config.local, if one is set."""
    from configobj import ConfigObj

    merged: dict = {}
    for name in ("config", "config.local"):
        path = Path(root) / ".dvc" / name
        if path.is_file():
            for section, values in ConfigObj(str(path)).items():
                merged.setdefault(section, {}).update(values)
    default = merged.get("core", {}).get("remote")
    if not default:
        return None
    url = merged.get(f'remote "{default}"', {}).get("url")
    return (default, url) if url else None


def local_remote_path(root: Path, url: str) -> Path | None:
    """The directory of a local remote (a path, or file://), resolved like DVC does from .dvc/."""
    parsed = urlparse(url)
    if parsed.scheme not in ("", "file") or (len(parsed.scheme) == 1):  # "C:" would parse as a scheme
        return None
    path = Path(parsed.path if parsed.scheme == "file" else url)
    return path if path.is_absolute() else (Path(root) / ".dvc" / path).resolve()


def prefect_store(root: Path) -> Store:
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    home = Path(settings.home).expanduser()
    paths = [home, Path(settings.results.local_storage_path).expanduser()]
    database = settings.server.database.connection_url
    url = database.get_secret_value() if database is not None else ""
    if url.startswith("sqlite"):
        paths.append(Path(url.split(":///", 1)[-1]).expanduser())
    note = "its home (database, result storage, logs)"
    api = settings.api.url or ""
    if api and urlparse(api).hostname not in ("127.0.0.1", "localhost"):
        note += f"; the API server at {api} keeps its own database, which this machine cannot scan"
    return Store("prefect", _distinct(paths), note=note)


def mlflow_store(root: Path) -> Store:
    """The workspace's own MLflow store (``mlflow/``; on PostgreSQL its artifacts there, its database
    the store ``mlflow-database``), or — with ``mlflow.tracking_uri`` set — what of it this machine can
    read: nothing of a tracking server (its database and artifact destination are the server's), the
    database file of a sqlite URI elsewhere."""
    from stores.postgres import workspace_config
    from stores.registry import is_tracking_server, tracking_uri

    root = Path(root)
    uri = tracking_uri(root)
    own = f"sqlite:///{(root / 'mlflow' / 'mlflow.db').resolve()}"
    if workspace_config(root) is not None and not _configured_elsewhere(root):
        return Store("mlflow", [root / "mlflow"], note="every version's artifacts (mlflow/artifacts); the tracking "
                                                       "database is the store mlflow-database")
    if uri == own:
        return Store("mlflow", [root / "mlflow"], note="tracking database and every version's artifacts")
    if is_tracking_server(uri):
        return Store("mlflow", [], in_scope=False,
                     note=f"the tracking server {_without_credentials(uri)} keeps the runs, the registry and the artifacts in its own "
                          "backend store and artifact destination, which this machine cannot scan (versions hold "
                          "zeros as input examples; `ingest --purge` reads each version's examples back)")
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        return Store("mlflow", _distinct([root / "mlflow", Path(uri.split(":///", 1)[-1])]),
                     note=f"the tracking database {uri} and every version's artifacts (mlflow/artifacts)")
    return Store("mlflow", [root / "mlflow"], note=f"every version's artifacts (mlflow/artifacts); the tracking "
                                                   f"database at {parsed.scheme}://{parsed.hostname} is not scanned")


def _configured_elsewhere(root: Path) -> bool:
    """params.yaml names an MLflow store (a tracking server): the workspace's database is not it."""
    from fedunlearn.config import load_params

    params = Path(root) / "params.yaml"
    return params.is_file() and bool(load_params(params).mlflow.tracking_uri)


def database_stores(root: Path) -> list[Store]:
    """The PostgreSQL databases of a workspace served on them (none otherwise), and its own cluster's files."""
    from stores import postgres

    config = postgres.workspace_config(root)
    if config is None:
        return []
    databases = [d for d in postgres.DATABASES if d != "mlflow" or not _configured_elsewhere(root)]
    try:
        server = postgres.workspace_server(root)
    except postgres.PostgresFailed as err:
        return [Store(f"{d}-database", [], in_scope=False, location=f"{config['server']} database {d}",
                      note=f"not scanned: {err}") for d in databases]
    stores = [_database_store(server, database) for database in databases]
    if config.get("server") == "local":
        cluster = postgres.LocalCluster(Path(root) / postgres.PG_DIR)
        stores.append(Store("postgres-cluster", [cluster.data], in_scope=False,
                            note="the cluster's files are not read as files: its databases are scanned row by row "
                                 "(prefect-database, mlflow-database); a row deleted from a table stays in its pages "
                                 "and the WAL, in PostgreSQL's page format, until VACUUM and WAL recycling"))
    return stores


def _database_store(server, database: str) -> Store:
    from stores import postgres

    name, location = f"{database}-database", server.display(database)
    try:
        unreadable = postgres.unreadable_tables(server, database)
    except postgres.PostgresFailed as err:
        return Store(name, [], in_scope=False, location=location, note=f"not scanned: {err}")
    if unreadable:
        return Store(name, [], in_scope=False, location=location,
                     note=f"not scanned: {server.user} may not read {', '.join(unreadable[:5])}"
                          f"{' …' if len(unreadable) > 5 else ''}; grant it SELECT on every table")
    what = "the Prefect server's" if database == "prefect" else "the MLflow tracking store's"
    return Store(name, [], location=location, contents=lambda: postgres.table_contents(server, database),
                 note=f"{what} database: every row of every table, as text (bytea columns as bytes)")


def erasure_stores(root: Path, purged: bool) -> list[Store]:
    root = Path(root)
    data = root / "data"
    data_paths = sorted(p for p in data.iterdir() if p.name != "receipts") if data.is_dir() else []
    stores = [Store("data", data_paths),
              Store("receipts", [data / "receipts"]),
              Store("dvc-cache", [root / ".dvc" / "cache"], in_scope=purged,
                    note="purged of earlier data versions" if purged else PURGE_NOTE)]
    remote = dvc_remote(root)
    if remote is not None:
        name, url = remote
        path = local_remote_path(root, url)
        if path is None:
            stores.append(Store("dvc-remote", [], in_scope=False, note=f"remote {name!r} ({url}) is not a local "
                                                                       "directory: not scanned"))
        else:
            stores.append(Store("dvc-remote", [path], in_scope=purged,
                                note=f"remote {name!r}, " + ("`dvc gc --cloud` after the purge" if purged
                                                             else PURGE_NOTE)))
    stores += [mlflow_store(root),
               prefect_store(root),
               *database_stores(root),
               Store("temporary files", [root / TEMPORARY_DIR, root / ".dvc" / "tmp"]),
               Store("model caches", [root / CACHE_DIR], note="the evaluator's shadow model, trained on held-out "
                                                               "rows; replaced when a request deletes one of them"),
               Store("benchmark outputs", [root / "artifacts", root / "results"])]
    return stores


def _without_credentials(uri: str) -> str:
    parsed = urlparse(uri)
    netloc = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
    return parsed._replace(netloc=netloc).geturl()


def _distinct(paths: list[Path]) -> list[Path]:
    """Paths not inside another of them (each file is read once)."""
    resolved = sorted({Path(os.path.abspath(p)) for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept
