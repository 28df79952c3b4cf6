"""Shared fixtures. Every test gets its own workspace (params, DVC repository, MLflow store)
and, when it runs a flow, its own Prefect home and temporary Prefect server."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Before anything imports Prefect, MLflow or GX: no telemetry, nothing under ~/.
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="fedunlearn-prefect-"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["GX_ANALYTICS_ENABLED"] = "False"
os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///" + os.path.join(tempfile.mkdtemp(prefix="fedunlearn-mlflow-"),
                                                                "unused.db")

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh workspace: the project's params.yaml and dvc.yaml, `dvc init --no-scm`, empty ledger."""
    from stores.workspace import init_workspace

    return init_workspace(tmp_path / "workspace", template=PROJECT_ROOT)


@pytest.fixture
def prefect_server(tmp_path: Path):
    """A temporary Prefect server with its own home and database for this test only."""
    from prefect.settings import PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path / "prefect-home"
    home.mkdir()
    with temporary_settings(updates={PREFECT_HOME: str(home)}):
        with prefect_test_harness(server_startup_timeout=120):
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
