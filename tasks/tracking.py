"""MLflow on the workspace's sqlite store: runs, per-round metrics and the model registry.

Tracking URI ``sqlite:///<root>/mlflow/mlflow.db``; artifacts under ``<root>/mlflow/artifacts``.
Each registered version carries the data version it was trained or unlearned on. Weights are
also stored as a plain ``state_dict`` (``weights.pt``) and always loaded with
``torch.load(..., weights_only=True)``: nothing from the store is unpickled.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

WEIGHTS_ARTIFACT = "weights/weights.pt"
# torch.export is not thread-safe (two exports at once fail: "SymInt ... is not tracked with
# proxy"): a probe saved in the background and a version being registered take turns.
_EXPORT_LOCK = threading.Lock()


def tracking_uri(root: Path) -> str:
    return f"sqlite:///{(Path(root) / 'mlflow' / 'mlflow.db').resolve()}"


def use_store(root: Path) -> "mlflow.MlflowClient":  # noqa: F821 - imported lazily
    import mlflow

    (Path(root) / "mlflow").mkdir(exist_ok=True)
    mlflow.set_tracking_uri(tracking_uri(root))
    mlflow.set_registry_uri(tracking_uri(root))
    return mlflow.MlflowClient()


def experiment_id(root: Path, name: str) -> str:
    client = use_store(root)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = (Path(root) / "mlflow" / "artifacts" / name).resolve().as_uri()
    return client.create_experiment(name, artifact_location=location)


def start_run(root: Path, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
    from mlflow.entities import Param

    client = use_store(root)
    run = client.create_run(experiment_id(root, experiment), run_name=run_name, tags=tags)
    # One transaction for all of them rather than a sqlite write per parameter.
    client.log_batch(run.info.run_id, params=[Param(key, str(value)) for key, value in params.items()])
    return run.info.run_id


def log_metrics(root: Path, run_id: str, metrics: dict[str, float], step: int | None = None) -> None:
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    use_store(root).log_batch(run_id, metrics=[Metric(key, float(value), stamp, step or 0)
                                               for key, value in metrics.items() if value is not None])


def end_run(root: Path, run_id: str, status: str = "FINISHED") -> None:
    use_store(root).set_terminated(run_id, status=status)


def register_model(root: Path, run_id: str, model: nn.Module, input_example: torch.Tensor, name: str,
                   tags: dict[str, str], alias: str | None) -> str:
    """Log the model to the run, register it as a new version of ``name``, tag it, set ``alias``.
    Returns the version number."""
    import mlflow
    import mlflow.pytorch

    client = use_store(root)
    model = model.to("cpu").eval()
    with mlflow.start_run(run_id=run_id):
        with tempfile.TemporaryDirectory() as tmp:
            weights = Path(tmp) / Path(WEIGHTS_ARTIFACT).name
            torch.save(model.state_dict(), weights)
            mlflow.log_artifact(str(weights), artifact_path=str(Path(WEIGHTS_ARTIFACT).parent))
        # Named requirements: inferring them runs a subprocess that imports the model (~6 s per version).
        with _EXPORT_LOCK:
            info = mlflow.pytorch.log_model(model, name="model", input_example=input_example.cpu().numpy(),
                                            pip_requirements=mlflow.pytorch.get_default_pip_requirements())
    # The tags in the same call that creates the version: a process killed in between must not
    # leave an untagged version that a re-run cannot recognise as its batch's (and registers again).
    version = str(mlflow.register_model(info.model_uri, name, tags={k: str(v) for k, v in tags.items()}).version)
    if alias:
        client.set_registered_model_alias(name, alias, version)
    return version


def prepare_model_logging() -> None:
    """Save a 2×2 probe model to a temporary directory. A process's first ``log_model`` pays once for
    importing ``torch.export`` and for MLflow's map of installed packages (~2.3 s of a 3.3 s
    registration, py-spy); run ahead in the background (``tasks.preload``), the registration that
    follows pays only for its own model. Local files only: no store is touched."""
    import mlflow.pytorch

    with tempfile.TemporaryDirectory() as tmp, _EXPORT_LOCK:
        mlflow.pytorch.save_model(nn.Linear(2, 2).eval(), str(Path(tmp) / "probe"), input_example=torch.zeros(2, 2).numpy(),
                                  pip_requirements=mlflow.pytorch.get_default_pip_requirements())


def load_weights(root: Path, name: str, alias: str | None = None, *,
                 version: str | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict and tags of the version ``name@alias`` or ``name`` v``version`` (weights_only:
    no unpickling)."""
    client = use_store(root)
    version = client.get_model_version(name, version) if version else client.get_model_version_by_alias(name, alias)
    with tempfile.TemporaryDirectory() as tmp:
        path = client.download_artifacts(version.run_id, WEIGHTS_ARTIFACT, tmp)
        state = torch.load(path, map_location="cpu", weights_only=True)
    return state, dict(version.tags)
