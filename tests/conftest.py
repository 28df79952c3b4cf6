"""Shared fixtures. Every test gets its own workspace (params, DVC repository, MLflow store)
and, when it runs a flow, its own Prefect home and temporary Prefect server."""

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

from workspaces import temporary_prefect_server  # noqa: E402  (after the environment above)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh workspace: the project's params.yaml and dvc.yaml, `dvc init --no-scm`, empty ledger."""
    from stores.workspace import init_workspace

    return init_workspace(tmp_path / "workspace", template=PROJECT_ROOT)


@pytest.fixture
def prefect_server(tmp_path: Path):
    """A temporary Prefect server with its own home and database for this test only."""
    with temporary_prefect_server(tmp_path / "prefect-home") as home:
        yield home


@pytest.fixture(scope="module")
def module_prefect_server(tmp_path_factory):
    """One temporary Prefect server for a module's tests (each keeps its own workspace, MLflow
    store and DVC repository): a server's start (8-20 s) is a large share of a flow test's time."""
    with temporary_prefect_server(tmp_path_factory.mktemp("prefect-home")) as home:
        yield home


@pytest.fixture(scope="session", autouse=True)
def single_intra_op_thread():
    """Test models are tiny: a second intra-op thread gains nothing and, on a shared 2-core
    machine, makes training many times slower (threads spin-waiting for a busy core)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
