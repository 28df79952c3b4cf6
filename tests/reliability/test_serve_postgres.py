"""Serving on PostgreSQL end to end (issue 28), as `make serve` runs it: a throwaway workspace whose
own cluster `fedunlearn db start` makes in a temporary directory, `scripts/serve.sh` on it (the
Prefect server on the ``prefect`` database, the MLflow tracking server on ``mlflow``, the
deployments logging to that server), a model trained, three requests moved into the inbox and the
batch the deployment's trigger starts. Then: every ``processed`` event reached the server and was
counted by the proactive "waited too long" trigger, the server logged no "database is locked" and
no dead-letter message, the client never backed off after HTTP 503; the receipt's erasure report
scanned both databases row by row and found no deleted row; the new version is in the PostgreSQL
store with its artifacts in the workspace. Ctrl-C (SIGTERM) stops the cluster too.

Also the disaster-recovery scenario of tests/test_disaster_recovery.py against an MLflow tracking
server whose backend store is PostgreSQL (its ``mlflow_server`` fixture replaced here).

Minutes each: `make reliability` runs them; `make test` skips them. Skipped too where PostgreSQL's
server binaries are missing (scripts/install-postgres.sh installs them; .ci/run does)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from stores import postgres
from test_disaster_recovery import (  # noqa: F401  (collected here with this module's mlflow_server)
    running_mlflow_server,
    test_a_lost_workspace_restored_from_the_dvc_remote_and_the_mlflow_server_continues_exactly_once)
from test_postgres import needs_postgres, reachable_dir  # noqa: F401  (a fixture)
from test_serve_e2e import BIN, PROJECT_ROOT, free_port

SCENARIO = "digits-hfl"
FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = [needs_postgres, pytest.mark.skipif(not FULL, reason="minutes: runs under `make reliability` "
                                                                   "(RELIABILITY_FULL=1)")]


@pytest.fixture
def mlflow_server(reachable_dir, tmp_path):  # noqa: F811
    """`mlflow server` over a throwaway PostgreSQL cluster (artifacts proxied from a directory of its
    own), as tests/test_disaster_recovery.py's fixture of the same name yields it."""
    cluster = postgres.LocalCluster(reachable_dir / "cluster")
    server = postgres.Server("127.0.0.1", cluster.start(), postgres.ROLE, cluster.pgpass)
    postgres.create_databases(server)
    try:
        with running_mlflow_server(tmp_path, server.url("mlflow")) as running:
            yield running
    finally:
        cluster.stop()


def served(root: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    """scripts/serve.sh on free ports; returns it, the Prefect API and the MLflow UI once the deployments
    serve."""
    prefect_port, mlflow_port = free_port(), free_port()
    env.update(FEDUNLEARN_ROOT=str(root), PREFECT_PORT=str(prefect_port), MLFLOW_PORT=str(mlflow_port),
               SCENARIO=SCENARIO, SERVE_DB="postgres", CRON="0 3 * * *", PREFECT_HOME=str(root / ".prefect"))
    process = subprocess.Popen(["bash", str(PROJECT_ROOT / "scripts" / "serve.sh")], env=env, cwd=PROJECT_ROOT,
                               stdout=(root / "serve-sh.log").open("w"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline, log = time.monotonic() + 300, root / ".prefect" / "serve.log"
    while not (log.is_file() and "Your deployments are being served" in log.read_text(errors="replace")):
        assert process.poll() is None and time.monotonic() < deadline, (root / "serve-sh.log").read_text()
        time.sleep(1)
    return process, f"http://127.0.0.1:{prefect_port}/api", f"http://127.0.0.1:{mlflow_port}"


def event_count(api: str, name: str) -> int:
    body = json.dumps({"filter": {"event": {"name": [name]}}, "limit": 1}).encode()
    request = urllib.request.Request(f"{api}/events/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.load(response)["total"])


def trigger_buckets(root: Path) -> list[int]:
    """The count of each bucket of the proactive "waited too long" trigger (1: its processed event counted)."""
    connection = postgres.connect(postgres.workspace_server(root, start=False), "prefect")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT b.count FROM automation_bucket b JOIN automation a ON a.id = b.automation_id "
                           "WHERE a.name = 'waited too long'")
            return [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()


def wait_for_receipts(root: Path, count: int, process: subprocess.Popen, timeout: float = 900) -> list[Path]:
    deadline = time.monotonic() + timeout
    while len(found := sorted((root / "data" / "receipts").glob("*.json"))) < count:
        assert process.poll() is None and time.monotonic() < deadline, \
            (root / ".prefect" / "serve.log").read_text(errors="replace")[-4000:]
        time.sleep(2)
    return found


def test_served_on_postgres_a_triggered_batch_loses_no_event_and_its_scan_covers_the_databases(reachable_dir):  # noqa: F811
    from cli import main
    from fedunlearn.data.store import load_horizontal
    from fedunlearn.receipts import read_receipt
    from stores.registry import Registry
    from stores.workspace import init_workspace

    root = init_workspace(reachable_dir / "workspace", template=PROJECT_ROOT)
    params = root / "params.yaml"
    params.write_text(params.read_text().replace("batch_threshold: 10", "batch_threshold: 3"))
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "DATABASE_URL",
                                                            postgres.SERVED_TRACKING_ENV)}
    subprocess.run([str(BIN / "fedunlearn"), "--root", str(root), "db", "start"], env=env, check=True)
    process, api, mlflow_ui = served(root, env)
    try:
        # Trained while served: the Prefect server's API, MLflow's PostgreSQL store directly.
        subprocess.run([str(BIN / "fedunlearn"), "--root", str(root), "train", "--scenario", SCENARIO, "--inline"],
                       env={**env, "PREFECT_API_URL": api}, check=True, stdout=subprocess.DEVNULL)
        ids = load_horizontal(SCENARIO, root).clients[1].sample_ids[:3].tolist()
        for sample_id in ids:
            assert main(["--root", str(root), "request", "samples", "--scenario", SCENARIO, "--ids", sample_id]) == 0
        [path] = wait_for_receipts(root, 1, process)
        time.sleep(10)  # the last processed events through the server's event pipeline and triggers
        assert event_count(api, "fedunlearn.request.submitted") == event_count(api, "fedunlearn.request.processed") == 3
        assert trigger_buckets(root) == [1, 1, 1]  # each request's processed event counted
        # The MLflow UI lists the served version's files, which the flow wrote into the workspace.
        run_id = Registry(root).by_alias(SCENARIO, "current").run_id
        with urllib.request.urlopen(f"{mlflow_ui}/ajax-api/2.0/mlflow/artifacts/list?run_id={run_id}") as listing:
            assert {"weights", "model"} <= {f["path"] for f in json.load(listing)["files"]}
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # what Ctrl-C does: serve.sh stops all, the cluster last
        process.wait(timeout=180)
    server_log = (root / ".prefect" / "server.log").read_text(errors="replace")
    assert "database is locked" not in server_log and "dead letter" not in server_log, server_log[-4000:]
    assert not list((root / ".prefect" / "dlq").glob("*")) if (root / ".prefect" / "dlq").exists() else True
    assert "retryable status code 503" not in (root / ".prefect" / "serve.log").read_text(errors="replace")
    assert postgres.LocalCluster(root / postgres.PG_DIR).port() is None  # stopped with the rest

    receipt = read_receipt(root, path.stem)
    assert sorted(receipt.request_ids) and receipt.erasure["verified"], receipt.erasure
    stores = {store["name"]: store for store in receipt.erasure["stores"]}
    for name in ("prefect-database", "mlflow-database"):
        assert stores[name]["in_scope"] and stores[name]["files"] > 10 and not stores[name]["found"], stores[name]
        assert stores[name]["paths"][0].startswith("postgresql://fedunlearn@127.0.0.1:")
    assert not stores["postgres-cluster"]["in_scope"] and "row by row" in stores["postgres-cluster"]["note"]
    assert "mlflow-database" in stores["mlflow"]["note"] and stores["mlflow"]["in_scope"]
    # The version the served batch registered through the tracking server, read from the database directly
    # (the cluster started again for it), its artifacts in the workspace.
    current = Registry(root).by_alias(SCENARIO, "current")
    assert current.tags["batch_id"] == receipt.batch_id
    assert Path(Registry(root).client.get_run(current.run_id).info.artifact_uri.removeprefix("file://")).is_relative_to(
        root / "mlflow" / "artifacts")
    postgres.stop(root)
