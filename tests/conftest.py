"""Shared fixtures. Every test gets its own workspace (params, DVC repository, MLflow store);
flow tests share one temporary Prefect server per session, its home and database in a temporary
directory."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Before anything imports Prefect, MLflow or GX: no telemetry, nothing under ~/.
# A pytest-xdist worker inherits the controller's environment: it gets a Prefect home of its own.
if "PREFECT_HOME" not in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="fedunlearn-prefect-")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["GX_ANALYTICS_ENABLED"] = "False"
os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="fedunlearn-mlflow-"),
                                                                "unused.db")

PROJECT_ROOT = Path(__file__).resolve().parent.parent

from workspaces import (TrainedWorkspaces, cli_training, copy_workspace, temporary_prefect_server,  # noqa: E402
                        throwaway_postgres)


# The test files that take longest, longest first. `make test` hands whole files to its two xdist
# workers in collection order (--no-loadscope-reorder), each worker taking the next file as it runs
# short: started last, a long file would run on one worker while the other idles. The rest follow
# in their collection order. Relative to tests/; a file no longer here is ignored.
RUN_FIRST = ("test_forgetting_tiers_exact.py", "test_sharded_metrics.py", "test_forgetting_tiers_flow.py",
             "reliability/test_hostile_requests.py", "test_process_flow.py", "test_sibling_scenarios.py",
             "test_batch_end.py", "test_shard_debt_flow.py", "test_uncertainty.py", "test_audit.py",
             "test_transparency_hardening.py", "test_train_flow.py", "test_hf_kcu.py", "test_strength.py")


def run_first_rank(item: pytest.Item) -> int:
    """The position of the item's file in ``RUN_FIRST``; after all of them if it is not there."""
    try:
        name = item.path.relative_to(Path(__file__).parent).as_posix()
    except ValueError:
        return len(RUN_FIRST)
    return RUN_FIRST.index(name) if name in RUN_FIRST else len(RUN_FIRST)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``reliability`` outside tests/reliability are the slow end-to-end ones (whole
    servers, subprocess pipelines): ``make reliability`` runs them, ``make test`` names them skipped.
    On xdist workers the long files come first (``RUN_FIRST``); one process keeps pytest's order."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=run_first_rank)  # stable: within a file, and for the files not listed, the order stays
    if os.environ.get("RELIABILITY_FULL") == "1":
        return
    skip = pytest.mark.skip(reason="slow end to end: runs under `make reliability` (RELIABILITY_FULL=1)")
    for item in items:
        if item.get_closest_marker("reliability"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fresh_workspace_template(tmp_path_factory) -> Path:
    from stores.workspace import init_workspace

    return init_workspace(tmp_path_factory.mktemp("fresh") / "workspace", template=PROJECT_ROOT)


@pytest.fixture
def workspace(fresh_workspace_template, tmp_path: Path) -> Path:
    """A fresh workspace: the project's params.yaml and dvc.yaml, `dvc init --no-scm`, empty ledger
    (``init_workspace`` run once per session, copied: `dvc init` is a second a test)."""
    return copy_workspace(fresh_workspace_template, tmp_path / "workspace")


@pytest.fixture(scope="session")
def prefect_databases():
    """A throwaway PostgreSQL cluster for the session's test Prefect servers, a database each
    (``workspaces.PostgresDatabases``); None where PostgreSQL is not installed: SQLite then."""
    with throwaway_postgres() as databases:
        yield databases


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory, prefect_databases):
    """A temporary Prefect server (its own home in a temporary directory, its own database) for the
    session's flow tests (a server's start is a large share of a flow test's time). Each
    test keeps its own workspace, MLflow store and DVC repository; a test that reads the server's
    state filters it by what it made (its deployment's or flow run's ID)."""
    with temporary_prefect_server(tmp_path_factory.mktemp("prefect-home"), prefect_databases) as home:
        yield home


@pytest.fixture(scope="session")
def trained_workspaces(tmp_path_factory, prefect_databases):
    """Workspaces trained once per session (``TrainedWorkspaces.get``): tests take copies."""
    trained = TrainedWorkspaces(tmp_path_factory.mktemp("trained"),
                                prefect_databases.new() if prefect_databases else None)
    yield trained
    trained.close()


@pytest.fixture(scope="session")
def digits_hfl_template(trained_workspaces) -> Path:
    """The workspace in which `fedunlearn train --scenario digits-hfl --inline` ran once this
    session: tests copy it (``copy_workspace``) and never change it."""
    template, _ = trained_workspaces.get("digits-hfl", cli_training("digits-hfl"))
    return template


@pytest.fixture
def trained_digits_hfl(digits_hfl_template, tmp_path: Path) -> Path:
    """A copy of ``digits_hfl_template`` (it takes the place of the ``workspace`` fixture)."""
    return copy_workspace(digits_hfl_template, tmp_path / "workspace")


@pytest.fixture
def trained_canaries(trained_workspaces, tmp_path: Path) -> tuple[Path, list[str]]:
    """A workspace in which ``memorising.train_memorising_workspace`` ran (digits-canary-hfl trained),
    and the canary IDs it returned: a copy of one trained once per session."""
    from memorising import SCENARIO, train_memorising_workspace

    template, ids = trained_workspaces.get(SCENARIO, train_memorising_workspace)
    return copy_workspace(template, tmp_path / "workspace"), ids


@pytest.fixture(autouse=True)
def mlflow_global_uris_reset():
    """A test that sets MLflow's process-wide tracking or registry URI cannot pin a later test of the
    same worker to its store (a client built with a tracking URI alone takes the process-wide registry)."""
    yield
    import mlflow

    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)


@pytest.fixture(scope="session", autouse=True)
def single_intra_op_thread():
    """Test models are tiny: a second intra-op thread gains nothing and, on a shared 2-core
    machine, makes training many times slower (threads spin-waiting for a busy core)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
