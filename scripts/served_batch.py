"""A deletion batch in served mode, measured (issue 18 item 6): the flow time of a batch that a
Prefect deployment trigger started, split into core compute and orchestration by the flow itself
(``fedunlearn/timing.py``), as `make serve` runs it: each flow run is the process Prefect's runner starts for it
(``python -m prefect.engine``, the flow loaded from its module).

Steps: a fresh workspace (``fedunlearn init``) with ``requests.batch_threshold`` set to the batch
size, ``fedunlearn train``, then ``scripts/serve.sh`` (Prefect server, deployments with their event
triggers, the inbox watcher, MLflow UI) on free ports; N single-sample requests of distinct
training IDs written into the inbox (``submit_request``, what ``fedunlearn request`` calls);
nobody presses Run: the N-th request's event starts ``process-deletions``. When that run ends,
its log's timing line, its task-run timeline and its wall time are printed and written as JSON.

    .venv/bin/python scripts/served_batch.py --requests 100 [--scenario mnist5k-hfl] [--work /tmp/served]
                                             [--db postgres|sqlite] [--clients N]

``--db`` (issue 28): the databases `make serve` runs on — PostgreSQL (the default, as `make serve`:
the workspace's own cluster, made before training so the MLflow store is there from the start) or
SQLite (``SERVE_DB=sqlite``). Whether any event was lost is counted while the servers still run:
the ``fedunlearn.request.submitted`` and ``processed`` events the Prefect server holds (its API);
the proactive "waited too long" trigger's buckets, one per submitted request, and how many of them
counted its ``processed`` event (the database: the automations service keeps them there); in the
server's log, "database is locked" and dead-letter lines, and the messages in its dead-letter
queue ($PREFECT_HOME/dlq); in the deployments' log, the client's back-offs after HTTP 503.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import yaml

PROJECT = Path(__file__).resolve().parent.parent
BIN = PROJECT / ".venv" / "bin"
TIMING = re.compile(r"flow ([\d.]+) s: compute ([\d.]+) s, orchestration ([\d.]+) s \(([\d.]+)%\)")
STAGE = re.compile(r"([a-z-]+) ([\d.]+) s")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"serve.sh exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")


def prepare(work: Path, scenario: str, requests: int, db: str, clients: int | None) -> None:
    subprocess.run([BIN / "fedunlearn", "init", str(work)], check=True, stdout=subprocess.DEVNULL)
    if db == "postgres":  # the workspace's cluster made and its MLflow store there before training writes to it
        work.chmod(0o711)  # as root, the cluster runs as the user postgres, which must reach .postgres/
        subprocess.run([BIN / "fedunlearn", "--root", str(work), "db", "start"], check=True)
    params_path = work / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    params["requests"]["batch_threshold"] = requests
    if clients is not None:  # the same data split among more (or fewer) clients
        params["scenarios"][scenario]["partition"]["num_clients"] = clients
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run([BIN / "fedunlearn", "--root", str(work), "train", "--scenario", scenario], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ,
                                                                              "PREFECT_HOME": str(work / ".prefect")})


def submit(work: Path, scenario: str, requests: int, seed: int) -> list[str]:
    import random

    from fedunlearn.data.store import load_horizontal
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import submit_request
    from fedunlearn.requests.model import DeletionRequestModel

    ids = sorted(i for c in load_horizontal(scenario, work).clients for i in c.sample_ids.tolist())
    chosen = random.Random(seed).sample(ids, requests)
    folders = RequestFolders(work)
    for sample_id in chosen:
        submit_request(folders, DeletionRequestModel(scenario=scenario, kind="sample", sample_ids=[sample_id]))
    return chosen


def triggered_run(deployment: str, timeout: float):
    """The first flow run of ``deployment`` that an automation created, once it is final."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, LogFilter, LogFilterFlowRunId

    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        target = client.read_deployment_by_name(deployment)
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[target.id])))
            started = [r for r in runs if r.created_by and r.created_by.type == "AUTOMATION"]
            if started and started[0].state and started[0].state.is_final():
                # The run's last log lines reach the server a moment after its final state.
                for _ in range(30):
                    logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[started[0].id])))
                    messages = [entry.message for entry in logs]
                    if any(TIMING.search(m) for m in messages):
                        break
                    time.sleep(1)
                return started[0], messages
            time.sleep(5)
    raise TimeoutError(f"no automation-created run of {deployment} finished within {timeout:.0f} s")


LOST_SIGNS = {"database_is_locked_lines": "database is locked", "dead_letter_lines": "dead letter queue"}


def event_count(api: str, name: str) -> int:
    body = json.dumps({"filter": {"event": {"name": [name]}}, "limit": 1}).encode()
    request = urllib.request.Request(f"{api}/events/filter", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.load(response)["total"])


def waited_too_long_buckets(work: Path, db: str) -> list[int]:
    """The count of each bucket of the proactive trigger: 1 when it counted its request's ``processed``."""
    query = ("SELECT b.count FROM automation_bucket b JOIN automation a ON a.id = b.automation_id "
             "WHERE a.name = 'waited too long'")
    if db == "sqlite":
        import sqlite3

        with sqlite3.connect(work / ".prefect" / "prefect.db") as connection:
            return [row[0] for row in connection.execute(query)]
    from stores.postgres import connect, workspace_server

    connection = connect(workspace_server(work, start=False), "prefect")
    try:
        with connection.cursor() as cursor:
            cursor.execute(query)
            return [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()


def lost_events(work: Path, api: str, db: str) -> dict:
    """What the servers say of the batch's events, read while they run (the module docstring)."""
    time.sleep(10)  # the last processed events through the server's event pipeline and triggers
    buckets = waited_too_long_buckets(work, db)
    server_log = (work / ".prefect" / "server.log").read_text(errors="replace")
    serve_log = (work / ".prefect" / "serve.log").read_text(errors="replace")
    dlq = work / ".prefect" / "dlq"
    return {"db": db, "submitted_events": event_count(api, "fedunlearn.request.submitted"),
            "processed_events": event_count(api, "fedunlearn.request.processed"),
            "waited_too_long_buckets": len(buckets),
            "buckets_that_counted_processed": sum(1 for count in buckets if count >= 1),
            **{key: server_log.count(sign) for key, sign in LOST_SIGNS.items()},
            "dead_letter_messages": len(list(dlq.iterdir())) if dlq.is_dir() else 0,
            "http_503_backoffs": serve_log.count("retryable status code 503")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--scenario", default="mnist5k-hfl")
    parser.add_argument("--clients", type=int, default=None,
                        help="partition.num_clients of the scenario (default: as params.yaml has it)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/served"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", type=Path, default=PROJECT / "results" / "served_batch.json")
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres",
                        help="the databases of the Prefect server and the MLflow store (SERVE_DB of make serve)")
    args = parser.parse_args()
    work = args.work.resolve()
    if work.exists():
        raise SystemExit(f"{work} exists; remove it or pass another --work")
    started = time.perf_counter()
    prepare(work, args.scenario, args.requests, args.db, args.clients)
    prefect_port, mlflow_port = free_port(), free_port()
    env = {**os.environ, "FEDUNLEARN_ROOT": str(work), "PREFECT_PORT": str(prefect_port),
           "MLFLOW_PORT": str(mlflow_port), "SCENARIO": args.scenario, "SERVE_DB": args.db}
    os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{prefect_port}/api"
    serve = subprocess.Popen(["bash", str(PROJECT / "scripts" / "serve.sh")], env=env, cwd=PROJECT,
                             stdout=(work / "serve-sh.log").open("w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{prefect_port}/api/health", serve, 180)
        deadline = time.monotonic() + 180
        serve_log = work / ".prefect" / "serve.log"
        while not serve_log.is_file() or "Your deployments are being served" not in serve_log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise TimeoutError("the deployments did not start within 180 s")
            time.sleep(1)
        time.sleep(5)  # the watcher and the automations are registered before the deployments serve
        submit(work, args.scenario, args.requests, seed=0)
        submitted_at = datetime.now(timezone.utc)  # the last request's file is in the inbox
        run, messages = triggered_run("process-deletions/deletion-batches", args.timeout)
        events = lost_events(work, os.environ["PREFECT_API_URL"], args.db)
    finally:
        os.killpg(serve.pid, signal.SIGTERM)  # serve.sh stops the deployments, then the servers
        try:
            serve.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
    timing = next((TIMING.search(m) for m in messages if TIMING.search(m)), None)
    result = {"scenario": args.scenario, "requests": args.requests, "clients": args.clients, "db": args.db,
              "state": run.state.type.value,
              "flow_run": run.name, "run_wall_seconds": run.total_run_time.total_seconds(),
              "from_last_submission_to_end_seconds": round((run.end_time - submitted_at).total_seconds(), 1),
              "load_average": os.getloadavg(), "total_seconds": round(time.perf_counter() - started, 1),
              "events": events}
    if timing:
        line = timing.string
        by_stage = line.split("orchestration by stage: ", 1)[1] if "orchestration by stage: " in line else ""
        result.update(flow_seconds=float(timing[1]), core_seconds=float(timing[2]),
                      orchestration_seconds=float(timing[3]), orchestration_share=round(float(timing[4]) / 100, 4),
                      orchestration_by_stage={name: float(seconds) for name, seconds in STAGE.findall(by_stage)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    subprocess.run([BIN / "python", PROJECT / "scripts" / "task_timeline.py", work], check=False)


if __name__ == "__main__":
    sys.exit(main())
