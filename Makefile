# Two commands for a newcomer: `make demo` and `make test`. Each bootstraps .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean-data

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/fedunlearn demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean-data:
	rm -rf data/raw data/partitions dvc.lock .prefect mlflow/mlflow.db mlflow/artifacts
