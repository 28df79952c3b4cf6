# Two commands for a newcomer: `make demo` and `make test`. Each bootstraps .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo serve test reliability install clean-data

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

# Train mnist5k-hfl, submit two deletion requests, forget them in one batch (unlearned and retrained
# versions, gates, receipt) and print the registered versions side by side.
demo: $(STAMP)
	$(BIN)/fedunlearn demo

# Prefect server + UI, the deployments (deletion batches on a cron schedule; CRON="0 2 * * *") and the
# MLflow tracking server + UI, all on 127.0.0.1, their databases on the workspace's PostgreSQL cluster
# (.postgres/, installed by scripts/install-postgres.sh where missing; DATABASE_URL for another server;
# SERVE_DB=sqlite for SQLite); prints the URLs, Ctrl-C stops them all. The runs the CLI recorded (make demo's)
# are copied into its Prefect server first; while it serves, the workspace's CLI commands run on that server.
# The UI screenshot test (tests/test_ui_screenshots.py) needs headless Chromium: apt-get install -y chromium
serve: $(STAMP)
	scripts/serve.sh

# The layer contracts first (import-linter, [tool.importlinter] in pyproject.toml), then the suite on two
# pytest-xdist workers, a test file to a worker (its module fixtures stay in one process; each worker has
# its own Prefect home and session fixtures), the longest files first (tests/conftest.py RUN_FIRST: in
# collection order, not xdist's by number of tests). `make reliability` stays in one process: it times kills.
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10

# The whole reliability suite (tests/reliability): SIGKILL at every batch stage, the full hostile-input
# generation, concurrent batches; prints the figures at the end. `make test` runs a fast subset of it.
# Then the slow end-to-end tests marked `reliability` elsewhere (served path, UIs, restore, Flower, Dask).
reliability: $(STAMP)
	RELIABILITY_FULL=1 $(BIN)/python -m pytest -q tests/reliability
	RELIABILITY_FULL=1 $(BIN)/python -m pytest -q -m reliability tests --ignore=tests/reliability

clean-data:
	-test ! -x $(BIN)/fedunlearn || $(BIN)/fedunlearn db stop >/dev/null  # the cluster stops before its files go
	rm -rf data/raw data/partitions dvc.lock .prefect mlflow/mlflow.db mlflow/mlflow.db.moved-to-postgres mlflow/artifacts .postgres
