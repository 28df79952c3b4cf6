"""Both UIs render what the pipeline registers: Debian's headless Chromium loads the Prefect
deployments page and the MLflow registered-model page, served over one workspace as `make serve`
does, takes a screenshot of each and checks that the rendered pages name the deployments and the
model's versions. Skipped where Chromium is missing (`apt-get install -y chromium`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from test_serve_e2e import BIN, SCENARIO, free_port, serve_deployments, start_prefect, wait_for_deployment

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-headless-shell")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed; on Debian: "
                                                         "`apt-get install -y chromium`")

from test_serve_e2e import services  # noqa: E402,F401  (the fixture that stops every subprocess)

PAGE_TIMEOUT_S = 120


def render(url: str, screenshot) -> str:
    """Screenshot ``url`` and return its DOM once the single-page app has rendered it."""
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1600,1000",
               "--virtual-time-budget=15000"]
    subprocess.run([*browser, f"--screenshot={screenshot}", url], check=True, capture_output=True,
                   timeout=PAGE_TIMEOUT_S)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    return subprocess.run([*browser, "--dump-dom", url], check=True, capture_output=True, text=True,
                          timeout=PAGE_TIMEOUT_S).stdout


def register_versions(workspace) -> None:
    """Two small registered versions, tagged as the pipeline tags them (no training needed to render)."""
    import torch

    from tasks.registry import ModelWeights, Registry

    registry = Registry(workspace)
    for role, extra in (("original", {}), ("unlearned", {"method": "puf-special", "batch_id": "batch-ui"})):
        model = torch.nn.Linear(4, 2)
        run_id = registry.start_run(SCENARIO, role, {}, {"role": role})
        registry.register(run_id, SCENARIO, "hfl", ModelWeights(model.state_dict()), model, (4,),
                          {"role": role, "scenario": SCENARIO, "data_version": "0123456789", **extra}, role)
        registry.end_run(run_id)


def test_the_prefect_and_mlflow_uis_render_the_deployments_and_the_registered_versions(workspace, services,
                                                                                        tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api, server = start_prefect(services)
    register_versions(workspace)  # before the MLflow UI opens the store: both would create its tables
    mlflow_port = free_port()
    mlflow_ui = services.start("mlflow-ui", [str(BIN / "mlflow"), "ui", "--backend-store-uri",
                                             f"sqlite:///{workspace}/mlflow/mlflow.db", "--host", "127.0.0.1",
                                             "--port", str(mlflow_port)])
    services.wait_for(f"{api}/health", server)
    deployments = serve_deployments(services, workspace)
    with temporary_settings(updates={PREFECT_API_URL: api}):
        wait_for_deployment("benchmark/on-demand", deployments)
    services.wait_for(f"http://127.0.0.1:{mlflow_port}/health", mlflow_ui)

    prefect_page = render(f"{api.removesuffix('/api')}/deployments", tmp_path / "prefect-deployments.png")
    for name in ("deletion-batches", "process-deletions", "retrain-reference", "train-federated", "benchmark"):
        assert name in prefect_page, f"{name} not rendered on the Prefect deployments page"
    mlflow_page = render(f"http://127.0.0.1:{mlflow_port}/#/models/{SCENARIO}", tmp_path / "mlflow-model.png")
    for text in (SCENARIO, "Version 1", "Version 2", "unlearned", "puf-special"):
        assert text in mlflow_page, f"{text!r} not rendered on the MLflow registered-model page"
