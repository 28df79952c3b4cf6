"""The workspace's PostgreSQL (issue 28): a throwaway cluster in a temporary directory — loopback
only, a password on every connection — that a workspace's SQLite MLflow store moves into, which
every later command then uses (starting the cluster when it is stopped), and whose databases the
erasure scan reads row by row: a deleted row left in a table is found there, a server this machine
cannot reach is listed as not scanned, with the reason. Skipped only where PostgreSQL's server
binaries are missing (scripts/install-postgres.sh installs them)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from fedunlearn.requests import erasure
from stores import postgres


def postgres_binaries() -> Path | None:
    try:
        return postgres.binaries()
    except postgres.PostgresMissing:
        return None


needs_postgres = pytest.mark.skipif(postgres_binaries() is None,
                                    reason="no PostgreSQL server binaries (initdb, pg_ctl, postgres) on this machine: "
                                           "scripts/install-postgres.sh installs them")


@pytest.fixture
def reachable_dir():
    """A temporary directory PostgreSQL's own user can reach when the tests run as root (pytest's
    tmp_path is private to root; the cluster then runs as the user 'postgres')."""
    directory = Path(tempfile.mkdtemp(prefix="fedunlearn-pg-"))
    directory.chmod(0o711)
    yield directory
    for cluster in directory.glob("**/.postgres"):
        postgres.LocalCluster(cluster).stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def pg_workspace(reachable_dir, monkeypatch):
    from stores.workspace import init_workspace

    monkeypatch.delenv(postgres.SERVED_TRACKING_ENV, raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    root = reachable_dir / "ws"
    init_workspace(root)
    return root


@needs_postgres
def test_a_cluster_listens_on_loopback_asks_for_its_password_and_stops(reachable_dir):
    import psycopg2

    cluster = postgres.LocalCluster(reachable_dir / ".postgres")
    port = cluster.start()
    assert cluster.port() == port and cluster.start() == port  # started once
    server = postgres.Server("127.0.0.1", port, postgres.ROLE, cluster.pgpass)
    postgres.create_databases(server)
    connection = postgres.connect(server, "mlflow")
    with connection.cursor() as cursor:
        cursor.execute("SHOW listen_addresses")
        assert cursor.fetchone()[0] == "127.0.0.1"
    connection.close()
    with pytest.raises(psycopg2.OperationalError, match="password"):
        psycopg2.connect(host="127.0.0.1", port=port, user=postgres.ROLE, dbname="mlflow", passfile=os.devnull)
    assert oct(cluster.pgpass.stat().st_mode & 0o777) == "0o600"
    assert cluster.stop() and cluster.port() is None and not cluster.stop()


@needs_postgres
def test_the_sqlite_mlflow_store_moves_into_postgres_and_every_command_then_uses_it(pg_workspace, capsys, monkeypatch):
    from mlflow import MlflowClient

    from stores.registry import Registry, tracking_uri

    sqlite_uri = tracking_uri(pg_workspace)
    assert sqlite_uri.startswith("sqlite:///")
    client = MlflowClient(sqlite_uri, sqlite_uri)
    run = client.create_run(client.create_experiment("x", artifact_location=str(pg_workspace / "mlflow/artifacts/x")))
    client.log_param(run.info.run_id, "rounds", "3")
    client.create_registered_model("digits-hfl")
    version = client.create_model_version("digits-hfl", f"runs:/{run.info.run_id}/model", run.info.run_id,
                                          tags={"role": "original", "batch_id": "b-1"})
    client.set_registered_model_alias("digits-hfl", "current", version.version)

    server = postgres.start(pg_workspace)
    assert "moved the MLflow store" in capsys.readouterr().err
    assert not (pg_workspace / "mlflow/mlflow.db").exists() and (pg_workspace / "mlflow" / postgres.MOVED_SQLITE).exists()
    assert tracking_uri(pg_workspace) == server.url("mlflow")
    registry = Registry(pg_workspace)
    assert registry.by_alias("digits-hfl", "current").run_id == run.info.run_id and registry.batch_ids() == {"b-1"}
    assert registry.experiment_id("new") != registry.experiment_id("x")  # its key sequence continues after the copy

    postgres.stop(pg_workspace)  # a command run later starts the workspace's cluster itself, and says so
    assert Registry(pg_workspace).batch_ids() == {"b-1"}
    assert "started the workspace's PostgreSQL cluster" in capsys.readouterr().err
    monkeypatch.setenv(postgres.SERVED_TRACKING_ENV, "http://127.0.0.1:5999")  # make serve's tracking server
    assert tracking_uri(pg_workspace) == "http://127.0.0.1:5999" and not Registry(pg_workspace).server


@needs_postgres
def test_the_erasure_scan_reads_the_databases_row_by_row_and_finds_a_deleted_row_left_there(pg_workspace):
    from stores.erasure import erasure_stores
    from stores.registry import Registry

    rows = np.random.default_rng(0).random((2, 16), dtype=np.float32)
    fingerprints = erasure.take_fingerprints([erasure.RowSource("x", ["gone", "kept"], rows)], {"gone"})
    server = postgres.start(pg_workspace)
    Registry(pg_workspace)  # MLflow's tables
    stores = {store.name: store for store in erasure_stores(pg_workspace, purged=False)}
    assert stores["prefect-database"].in_scope and stores["mlflow-database"].in_scope
    assert not stores["postgres-cluster"].in_scope and "row by row" in stores["postgres-cluster"].note
    databases = [stores["prefect-database"], stores["mlflow-database"]]
    clean = erasure.verify_erasure(fingerprints, databases, pg_workspace)
    assert clean.verified and clean.stores[1].files > 40  # MLflow's tables (Prefect's: made by its server)

    connection = postgres.connect(server, "mlflow")  # a copy of the row, as an example written as JSON would be
    with connection, connection.cursor() as cursor:
        cursor.execute("CREATE TABLE leaked (note text)")
        cursor.execute("INSERT INTO leaked VALUES (%s)", (json.dumps({"inputs": rows[0].tolist()}),))
    connection.close()
    report = erasure.verify_erasure(fingerprints, databases, pg_workspace)
    assert not report.verified and report.found == {"gone": ["mlflow-database:mlflow/public.leaked"]}
    assert [scan.name for scan in report.holding_stores()] == ["mlflow-database"]


@needs_postgres
def test_a_database_this_machine_cannot_reach_is_listed_as_not_scanned_with_the_reason(pg_workspace):
    from stores.erasure import erasure_stores

    postgres.write_private(pg_workspace / ".postgres" / "pgpass", "")
    postgres.write_private(postgres.marker(pg_workspace), json.dumps({"server": "postgresql://someone@127.0.0.1:1/db"}))
    stores = {store.name: store for store in erasure_stores(pg_workspace, purged=False)}
    for name in ("prefect-database", "mlflow-database"):
        assert not stores[name].in_scope and "not scanned: cannot connect to postgresql://someone@127.0.0.1:1/" \
            in stores[name].note, stores[name].note
    assert "postgres-cluster" not in stores  # the server is not the workspace's: no files of it here
