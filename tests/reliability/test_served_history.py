"""`make demo`, then `make serve` (issue 37): the Prefect UI's runs page lists the demo's deletion
batch with its receipt and status artifacts, and while the workspace is served its CLI commands run
on the served server with no setting. On PostgreSQL (the demo's runs copied from .prefect/prefect.db,
once: a second serve copies nothing) and on SQLite (the served server opens that database: nothing
to copy). Through scripts/serve.sh and the Prefect REST API, as a user's browser reads it.

Minutes (the demo, three serves): `make reliability` runs it; `make test` skips it. The PostgreSQL
half is skipped where PostgreSQL's server binaries are missing (scripts/install-postgres.sh)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from stores import postgres
from test_postgres import needs_postgres, reachable_dir  # noqa: F401  (a fixture)
from test_serve_e2e import BIN, PROJECT_ROOT, free_port
from workspaces import copy_workspace

SCENARIO = "digits-hfl"
FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = pytest.mark.skipif(not FULL, reason="minutes: runs under `make reliability` (RELIABILITY_FULL=1)")
STATUS_KEY = f"deletion-status-{SCENARIO}"


def user_environment() -> dict[str, str]:
    """A user's shell: no Prefect API, no tracking URI, no database of the tests'."""
    drop = ("PREFECT_API_URL", "PREFECT_HOME", "MLFLOW_TRACKING_URI", "DATABASE_URL", postgres.SERVED_TRACKING_ENV)
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.fixture(scope="module")
def demo_workspace(tmp_path_factory) -> Path:
    """A workspace in which `fedunlearn demo --scenario digits-hfl` ran (its own Prefect server)."""
    from stores.workspace import init_workspace

    root = init_workspace(tmp_path_factory.mktemp("demo") / "workspace", template=PROJECT_ROOT)
    demo = subprocess.run([str(BIN / "fedunlearn"), "--root", str(root), "demo", "--scenario", SCENARIO],
                          env=user_environment(), capture_output=True, text=True, timeout=1200)
    assert demo.returncode == 0, demo.stderr[-4000:]
    return root


def serve(root: Path, database: str) -> tuple[subprocess.Popen, str, str]:
    """scripts/serve.sh on free ports; it, its Prefect API and its printout once the deployments serve."""
    port = free_port()
    env = {**user_environment(), "FEDUNLEARN_ROOT": str(root), "PREFECT_PORT": str(port),
           "MLFLOW_PORT": str(free_port()), "SCENARIO": SCENARIO, "SERVE_DB": database, "CRON": "0 3 * * *"}
    printout = root / f"serve-sh-{time.monotonic_ns()}.log"
    process = subprocess.Popen(["bash", str(PROJECT_ROOT / "scripts" / "serve.sh")], env=env, cwd=PROJECT_ROOT,
                               stdout=printout.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while "Ctrl-C stops" not in printout.read_text(errors="replace"):
        assert process.poll() is None and time.monotonic() < deadline, printout.read_text()
        time.sleep(1)
    return process, f"http://127.0.0.1:{port}/api", printout.read_text()


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)  # what Ctrl-C does
    process.wait(timeout=180)


def post(api: str, path: str, body: dict) -> list[dict]:
    request = urllib.request.Request(f"{api}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def batches(api: str) -> list[dict]:
    """The process-deletions flow runs the server lists, each with its artifacts' keys."""
    runs = post(api, "/flow_runs/filter", {"flows": {"name": {"any_": ["process-deletions"]}},
                                           "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}})
    for run in runs:
        artifacts = post(api, "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
        run["artifact_keys"] = {artifact["key"] for artifact in artifacts}
    return runs


def run_cli_while_served(root: Path) -> subprocess.CompletedProcess:
    """`fedunlearn process` with nothing pending, its runner named so that the flow runs (a short flow
    run; without ``--runner`` an idle `process` answers without starting Prefect at all)."""
    return subprocess.run([str(BIN / "fedunlearn"), "--root", str(root), "process", "--scenario", SCENARIO,
                           "--runner", "in-process"], env=user_environment(), capture_output=True, text=True,
                          timeout=600)


@needs_postgres
def test_on_postgresql_the_demo_is_copied_once_and_the_cli_runs_on_the_served_server(demo_workspace,
                                                                                     reachable_dir):  # noqa: F811
    root = copy_workspace(demo_workspace, reachable_dir / "workspace")
    process, api, printout = serve(root, "postgres")
    try:
        brought = re.search(r"brought (\d+) flow runs of the CLI into the served Prefect server \(tag from-cli; "
                            r"1 deletion batch\(es\)\)", printout)
        assert brought and int(brought[1]) >= 2, printout  # the demo's training, batch, retrain, ...
        [demo_batch] = batches(api)
        assert "from-cli" in demo_batch["tags"]
        assert {"deletion-receipt", STATUS_KEY, "deletion-batch", "deletion-batch-models"} <= \
               demo_batch["artifact_keys"]
        marker = json.loads((root / ".prefect" / "served.json").read_text())
        assert marker["api_url"] == api

        command = run_cli_while_served(root)
        assert command.returncode == 0, command.stderr[-4000:]
        runs_page = f"{api.removesuffix('/api')}/runs"
        assert f"runs show in the Prefect UI: {runs_page}" in command.stderr
        assert [run["tags"] for run in batches(api) if run["id"] != demo_batch["id"]] == [[]]  # its own run, here
    finally:
        stop(process)
    assert not (root / ".prefect" / "served.json").exists()  # withdrawn as serve stopped

    process, api, printout = serve(root, "postgres")  # again: nothing is copied twice
    try:
        assert (f"no new runs of the CLI to bring into the served Prefect server; {brought[1]} copied before"
                in printout), printout
        assert len(batches(api)) == 2
    finally:
        stop(process)


def test_on_sqlite_the_served_server_opens_the_demos_database(demo_workspace, tmp_path):
    root = copy_workspace(demo_workspace, tmp_path / "workspace")
    process, api, printout = serve(root, "sqlite")
    try:
        assert "the served Prefect server uses the CLI's own database (.prefect/prefect.db)" in printout, printout
        [demo_batch] = batches(api)
        assert "from-cli" not in demo_batch["tags"]  # the demo's own run, not a copy
        assert {"deletion-receipt", STATUS_KEY} <= demo_batch["artifact_keys"]
        command = run_cli_while_served(root)  # on the served server: no second server on the database
        assert command.returncode == 0 and "runs show in the Prefect UI" in command.stderr, command.stderr[-4000:]
        assert len(batches(api)) == 2
    finally:
        stop(process)
    assert not (root / ".prefect" / "served.json").exists()
