"""Both UIs render what the pipeline registers: Debian's headless Chromium loads the Prefect
deployments page and the MLflow registered-model page, served over one workspace as `make serve`
does, takes a screenshot of each and checks that the rendered pages name the deployments and the
model's versions; then an unlearned version's run page, which shows the run's data version as its
dataset input (the DVC hash as digest) beside the version's description (issue 18, lineage).
``UPDATE_SCREENSHOTS=1`` writes that one to docs/img/mlflow-dataset-input.png. Skipped where
Chromium is missing (`apt-get install -y chromium`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import test_serve_e2e
from test_serve_e2e import BIN, SCENARIO, free_port, serve_deployments, start_prefect, wait_for_deployment

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-headless-shell")
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed; on Debian: "
                                                          "`apt-get install -y chromium`"),
              pytest.mark.reliability]  # both UIs served and rendered: `make reliability`

services = test_serve_e2e.services  # the fixture that stops every subprocess it started

PAGE_TIMEOUT_S = 120
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
# The MLflow UI opens its assistant panel over a third of the page when its host is localhost or
# 127.0.0.1: the lineage page is browsed under another name for the loopback address.
UI_HOST = "mlflow.ui"
BEFORE, AFTER = (hashlib.md5(name.encode()).hexdigest() for name in ("before", "after"))  # DVC-style data versions


def render(url: str, screenshot, *options: str) -> str:
    """Screenshot ``url`` and return its DOM once the single-page app has rendered it: one page
    load, headless Chromium running both commands on it after the virtual-time budget."""
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1600,1000",
               "--virtual-time-budget=15000", *options]
    dom = subprocess.run([*browser, f"--screenshot={screenshot}", "--dump-dom", url], check=True, capture_output=True,
                         text=True, timeout=PAGE_TIMEOUT_S).stdout
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 20_000
    return dom


def register_versions(workspace) -> str:
    """Two small registered versions, tagged, described and with their data versions as the pipeline
    logs them (no training needed to render); returns the unlearned version's run."""
    import torch

    from fedunlearn.certify.gates import GateCheck, GateOutcome
    from fedunlearn.config import load_params
    from fedunlearn.requests.batch import BatchRecord, VersionChange
    from fedunlearn.requests.ledger import LedgerEntry
    from tasks.models import batch_description, training_description
    from stores.registry import ModelWeights, Registry

    registry = Registry(workspace)
    record = BatchRecord(batch_id="batch-ui", scenario=SCENARIO, dataset="digits", requests=[
        LedgerEntry(request_id=f"req-ui-{n}", kind="sample", sample_ids=[f"s{n}-{k}" for k in range(4)])
        for n in range(3)], data_versions={SCENARIO: VersionChange(before=BEFORE, after=AFTER)})
    gate = GateOutcome(passed=True, policy="vs retrained reference", checks=[
        GateCheck(name=name, value=0.0, limit=0.05, passed=True) for name in ("test_acc_gap", "forget_acc_gap",
                                                                               "mia_auc_gap", "audit")])
    descriptions = {
        "original": training_description(SCENARIO, load_params(workspace / "params.yaml").scenario(SCENARIO),
                                         BEFORE, "original"),
        "unlearned": batch_description(record, 0, 4, "puf-special", {}, "empirical only", "1", gate)}
    for role, data_version, context, extra in (
            ("original", BEFORE, "training", {}),
            ("unlearned", AFTER, "unlearning", {"method": "puf-special", "batch_id": "batch-ui"})):
        model = torch.nn.Linear(4, 2)
        run_id = registry.start_run(SCENARIO, role, {}, {"role": role})
        registry.log_data_version(run_id, SCENARIO, data_version, context)
        registry.register(run_id, SCENARIO, "hfl", ModelWeights(model.state_dict()), model, (4,),
                          {"role": role, "scenario": SCENARIO, "data_version": data_version, **extra}, role,
                          description=descriptions[role])
        registry.end_run(run_id)
    return run_id


def test_the_prefect_and_mlflow_uis_render_the_deployments_and_the_registered_versions(workspace, services,
                                                                                        tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api, server = start_prefect(services)
    unlearned_run = register_versions(workspace)  # before the MLflow UI opens the store: both would create its tables
    mlflow_port = free_port()
    hosts = [f"127.0.0.1:{mlflow_port}", f"{UI_HOST}:{mlflow_port}"]
    mlflow_ui = services.start("mlflow-ui", [str(BIN / "mlflow"), "ui", "--backend-store-uri",
                                             f"sqlite:///{workspace}/mlflow/mlflow.db", "--host", "127.0.0.1",
                                             "--port", str(mlflow_port), "--workers", "1",  # ready once it answers
                                             "--allowed-hosts", ",".join(hosts),
                                             "--cors-allowed-origins", ",".join(f"http://{h}" for h in hosts)])
    services.wait_for(f"{api}/health", server)
    deployments = serve_deployments(services, workspace)
    with temporary_settings(updates={PREFECT_API_URL: api}):
        wait_for_deployment("benchmark/all-methods", deployments)
    services.wait_for(f"http://127.0.0.1:{mlflow_port}/health", mlflow_ui)

    prefect_page = render(f"{api.removesuffix('/api')}/deployments", tmp_path / "prefect-deployments.png")
    for name in ("deletion-batches", "process-deletions", "retrain-reference", "train-federated", "benchmark"):
        assert name in prefect_page, f"{name} not rendered on the Prefect deployments page"
    mlflow_page = render(f"http://127.0.0.1:{mlflow_port}/#/models/{SCENARIO}", tmp_path / "mlflow-model.png")
    for text in (SCENARIO, "Version 1", "Version 2", "unlearned", "puf-special"):
        assert text in mlflow_page, f"{text!r} not rendered on the MLflow registered-model page"

    # Lineage: the unlearned version's run shows its data version (digest: the DVC hash) and why it exists.
    from stores.registry import Registry

    experiment = Registry(workspace).client.get_run(unlearned_run).info.experiment_id
    image = (DOCS_IMG if os.environ.get("UPDATE_SCREENSHOTS") else tmp_path) / "mlflow-dataset-input.png"
    run_page = render(f"http://{UI_HOST}:{mlflow_port}/#/experiments/{experiment}/runs/{unlearned_run}"
                      "?workflowType=machine_learning", image, f"--host-resolver-rules=MAP {UI_HOST} 127.0.0.1")
    for text in (f"partition@{SCENARIO}", AFTER, "unlearning", "batch-ui", "req-ui-0", "puf-special",
                 "empirical only"):
        assert text in run_page, f"{text!r} not rendered on the MLflow run page"
