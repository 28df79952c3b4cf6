#!/usr/bin/env bash
# `make serve`: the Prefect server and UI, the deployments (fedunlearn serve) and the MLflow UI, all
# bound to 127.0.0.1, on PostgreSQL. Prints the URLs; Ctrl-C stops them all. Before the deployments,
# the flow runs the CLI recorded in .prefect/prefect.db (make demo's) are copied into the served
# server (fedunlearn served copy-runs), and while it serves, the workspace's CLI commands run their
# flows on it (the marker $PREFECT_HOME/served.json: fedunlearn served announce|withdraw).
#   FEDUNLEARN_ROOT (workspace, default .), SCENARIO (default of the forms, mnist5k-hfl),
#   CRON (deletion batches, default daily 02:00 UTC), PREFECT_PORT (4200), MLFLOW_PORT (5000),
#   SERVE_FLAGS (more flags of `fedunlearn serve`, e.g. --cold-runs),
#   SERVE_DB: postgres (default) — the Prefect server's database and the MLflow tracking server's store
#     on the workspace's own PostgreSQL cluster (.postgres/, started here, stopped on Ctrl-C) or on the
#     server in DATABASE_URL; sqlite — Prefect's .prefect/prefect.db, the MLflow server over mlflow/mlflow.db.
set -euo pipefail
set -m  # every background job in its own process group: stopping one stops its workers too

BIN="$(cd "$(dirname "$0")/.." && pwd)/.venv/bin"
ROOT="$(cd "${FEDUNLEARN_ROOT:-.}" && pwd)"
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
SCENARIO="${SCENARIO:-mnist5k-hfl}"
CRON="${CRON:-0 2 * * *}"
export PREFECT_HOME="${PREFECT_HOME:-$ROOT/.prefect}"
export PREFECT_API_URL="http://127.0.0.1:$PREFECT_PORT/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false GX_ANALYTICS_ENABLED=False
# The server's sqlite database takes one writer at a time. By default Prefect records every task-run
# event in a transaction of its own (batch size 1): a deletion batch's ~250 events kept the database
# busy, and the flow's own writes (a sub-flow's creation, a concurrency slot) met "database is locked"
# (HTTP 503) and retried after 2 s. Batched, the UI shows a task run's state within a second.
export PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE="${PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_READ_BATCH_SIZE:-100}" \
       PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE="${PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE:-100}" \
       PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL="${PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL:-1}" \
       PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE="${PREFECT_SERVER_SERVICES_EVENT_PERSISTER_READ_BATCH_SIZE:-100}" \
       PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE="${PREFECT_SERVER_SERVICES_EVENT_PERSISTER_BATCH_SIZE:-200}"
SERVE_DB="${SERVE_DB:-postgres}"
mkdir -p "$PREFECT_HOME" "$ROOT/mlflow"
# An MLflow tracking server named in params.yaml (mlflow.tracking_uri) is the UI: no `mlflow ui` here.
TRACKING="$("$BIN/python" -c 'import sys, yaml
print(((yaml.safe_load(open(sys.argv[1])) or {}).get("mlflow") or {}).get("tracking_uri") or "")' "$ROOT/params.yaml")"
case "$TRACKING" in
  http://*|https://*) MLFLOW_UI="${TRACKING%/}" ;;
  *) CONFIGURED_STORE="$TRACKING" TRACKING="" MLFLOW_UI="http://127.0.0.1:$MLFLOW_PORT" ;;  # a database URI, or none
esac

pids=()
PREFECT_PID=""
stop() {  # the marker, the deployments (they pause themselves on the server), the servers, then the database
  trap - EXIT INT TERM
  if [ -n "$PREFECT_PID" ]; then  # CLI commands started from now on start a server of their own again
    "$BIN/fedunlearn" --root "$ROOT" served withdraw --pid "$PREFECT_PID" >/dev/null 2>&1 || true
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM -- "-${pids[i]}" 2>/dev/null || continue
    for _ in $(seq 20); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-${pids[i]}" 2>/dev/null || true
  done
  if [ "$SERVE_DB" = postgres ]; then "$BIN/fedunlearn" --root "$ROOT" db stop >/dev/null || true; fi
}
trap stop EXIT INT TERM

wait_for() {  # URL NAME LOG
  for _ in $(seq 120); do
    "$BIN/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" 2>/dev/null \
      && return 0
    sleep 1
  done
  echo "$2 did not start within 120 s; see $3" >&2
  exit 1
}

case "$SERVE_DB" in
  postgres)  # the cluster made and started (PostgreSQL installed first where it is missing)
    "$(dirname "$0")/install-postgres.sh" >/dev/null
    DB_ENV="$("$BIN/fedunlearn" --root "$ROOT" db start --shell)"  # a failure stops here (set -e)
    eval "$DB_ENV"  # export PREFECT_API_DATABASE_CONNECTION_URL, MLFLOW_BACKEND_STORE_URI
    STORE="$MLFLOW_BACKEND_STORE_URI" ;;
  sqlite)
    if [ -f "$ROOT/.postgres/workspace.json" ]; then
      echo "$ROOT keeps its MLflow store on PostgreSQL (.postgres/): serve it with SERVE_DB=postgres" >&2; exit 2
    fi
    STORE="sqlite:///$ROOT/mlflow/mlflow.db" ;;
  *) echo "SERVE_DB must be postgres or sqlite, not '$SERVE_DB'" >&2; exit 2 ;;
esac

"$BIN/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT" >"$PREFECT_HOME/server.log" 2>&1 &
pids+=($!)
if [ -z "$TRACKING" ]; then
  # The UI and, on PostgreSQL, the tracking server the served flows log to (artifacts stay in mlflow/artifacts).
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false "$BIN/mlflow" server --host 127.0.0.1 --port "$MLFLOW_PORT" --workers 2 \
    --backend-store-uri "${CONFIGURED_STORE:-$STORE}" --default-artifact-root "$ROOT/mlflow/artifacts" \
    >"$ROOT/mlflow/ui.log" 2>&1 &
  pids+=($!)
  if [ "$SERVE_DB" = postgres ]; then export FEDUNLEARN_MLFLOW_TRACKING_URI="$MLFLOW_UI"; fi
fi
wait_for "$PREFECT_API_URL/health" "The Prefect server" "$PREFECT_HOME/server.log"
# From here until Ctrl-C the workspace's CLI commands run their flows on this server (runtime/served.py).
"$BIN/fedunlearn" --root "$ROOT" served announce --api-url "$PREFECT_API_URL" --pid "${pids[0]}"
PREFECT_PID="${pids[0]}"
wait_for "$MLFLOW_UI/health" "The MLflow UI" "$ROOT/mlflow/ui.log"
# The CLI's history (make demo's runs and artifacts) into the served UI: nothing on SQLite, where the
# server opens the CLI's own database; runs copied before are skipped (runtime/run_history.py).
HISTORY="$("$BIN/fedunlearn" --root "$ROOT" served copy-runs 2>"$PREFECT_HOME/copy-runs.log")" \
  || HISTORY="the CLI's runs were not copied: see $PREFECT_HOME/copy-runs.log"
"$BIN/fedunlearn" --root "$ROOT" serve --scenario "$SCENARIO" --cron "$CRON" ${SERVE_FLAGS:-} >"$PREFECT_HOME/serve.log" 2>&1 &
pids+=($!)

DATABASES="SQLite ($PREFECT_HOME/prefect.db, $ROOT/mlflow/mlflow.db)" STOPS=""
if [ "$SERVE_DB" = postgres ]; then
  DATABASES="PostgreSQL ${PREFECT_API_DATABASE_CONNECTION_URL%%\?*} and ${MLFLOW_BACKEND_STORE_URI%%\?*}"
  [ -n "${DATABASE_URL:-}" ] || STOPS=" and the workspace's PostgreSQL cluster ($ROOT/.postgres)"
fi
cat <<INFO

Prefect UI   http://127.0.0.1:$PREFECT_PORT/deployments   (Run ▸ Quick run / Custom run on process-deletions)
Runs         http://127.0.0.1:$PREFECT_PORT/runs   ($HISTORY)
             the workspace's CLI commands (fedunlearn process, train, ...) run on this server while it serves
MLflow UI    $MLFLOW_UI/#/models/$SCENARIO${TRACKING:+   (the tracking server in params.yaml)}
Deployments: process-deletions/deletion-batches (cron '$CRON' and event triggers),
             submit-deletion-requests/form, retrain-reference/exact-retrain, train-federated/new-original,
             repay-retrain-debt/weekly, train-audit-references/audit-references, benchmark/all-methods;
             log: $PREFECT_HOME/serve.log
Submit a request, then run the batch from the UI:
  $BIN/fedunlearn --root $ROOT request samples --scenario $SCENARIO --ids \$($BIN/fedunlearn --root $ROOT ids --scenario $SCENARIO --limit 5)
Databases:   $DATABASES
Ctrl-C stops the Prefect server, the deployments and the MLflow UI$STOPS.
INFO
wait -n
echo "a service stopped; stopping the others (logs: $PREFECT_HOME/server.log, serve.log, $ROOT/mlflow/ui.log)" >&2
