"""MLflow on the workspace's sqlite store: runs, per-round metrics and the model registry.

Tracking URI ``sqlite:///<root>/mlflow/mlflow.db``; artifacts under ``<root>/mlflow/artifacts``.
Each registered version carries the data version it was trained or unlearned on. Weights are
also stored as a plain ``state_dict`` (``weights.pt``) and always loaded with
``torch.load(..., weights_only=True)``: nothing from the store is unpickled.

No user data goes into an artifact: the input example that MLflow stores with a model (as
``input_example.json``, ``serving_input_example.json`` and inside ``model.pt2``, which keeps the
example it was exported with) is zeros of the model's input shape — a test row there would outlive
its deletion in every registered version.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import StateDamaged

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


def input_example(input_shape: tuple[int, ...]) -> torch.Tensor:
    """What MLflow stores as the model's example input: two rows of zeros, never user data."""
    return torch.zeros((2, *input_shape))


def register_model(root: Path, run_id: str, model: nn.Module, input_shape: tuple[int, ...], name: str,
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
            info = mlflow.pytorch.log_model(model, name="model", input_example=input_example(input_shape).numpy(),
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
    from mlflow.exceptions import MlflowException

    client = use_store(root)
    version = client.get_model_version(name, version) if version else client.get_model_version_by_alias(name, alias)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(version.run_id, WEIGHTS_ARTIFACT, tmp)
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (MlflowException, OSError, RuntimeError) as err:
            raise ModelArtifactMissing(
                f"{name} v{version.version} (run {version.run_id}, role {version.tags.get('role', '?')}): its weights "
                f"artifact {WEIGHTS_ARTIFACT} cannot be read from {client.get_run(version.run_id).info.artifact_uri} "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'}). Restore the "
                f"artifact, or register a new model on the current data version with `fedunlearn retrain --scenario "
                f"{name}` and run the command again") from err
    return state, dict(version.tags)


class ModelArtifactMissing(StateDamaged):
    """A registered version's weights cannot be read back."""


# --- Versions registered before input examples were zeros ----------------------------------------

EXAMPLE_FILES = ("input_example.json", "serving_input_example.json")
ERASURE_TAG = "erasure"


def _zeroed(document: Any) -> Any:
    """The same JSON structure with every number 0 (the example's shape stays, its values go)."""
    if isinstance(document, dict):
        return {key: _zeroed(value) for key, value in document.items()}
    if isinstance(document, list):
        return [_zeroed(value) for value in document]
    return 0.0 if isinstance(document, (int, float)) and not isinstance(document, bool) else document


def scrub_examples(root: Path, fingerprints: "Fingerprints", batch_id: str) -> list[str]:  # noqa: F821
    """Rewrite, in place, the MLflow artifacts of every registered version that still hold a deleted
    row — the input examples of versions registered before they were zeros: the JSON examples with
    zeros of the same shape, ``data/model.pt2`` re-exported from the version's own weights with a zero
    example. The weights and what the version serves do not change. Each rewritten version is tagged
    ``erasure=artifacts-rewritten`` (``erasure_batch``: this batch); one whose artifacts are not on
    this machine is tagged ``erasure=contains-deleted-rows`` instead, and ``fedunlearn compare`` shows
    the tag. Returns ``<model> v<version>`` for each version touched."""
    import json
    from urllib.parse import urlparse

    from fedunlearn.requests.erasure import Store, verify_erasure

    found = set(verify_erasure(fingerprints, [Store("mlflow", [Path(root) / "mlflow"])], Path(root)).stores[0].found)
    if not found:
        return []
    client = use_store(root)
    touched = []
    for model in client.search_registered_models():
        for version in client.search_model_versions(f"name='{model.name}'"):
            if not version.source.startswith("models:/"):
                continue
            location = urlparse(client.get_logged_model(version.source.removeprefix("models:/")).artifact_location)
            directory = Path(location.path)
            inside = {f for f in found if (Path(root) / f).resolve().is_relative_to(directory.resolve())}
            if location.scheme != "file":
                client.set_model_version_tag(model.name, version.version, ERASURE_TAG, "contains-deleted-rows")
                continue
            if not inside:
                continue
            for name in EXAMPLE_FILES:
                path = directory / name
                if path.is_file():
                    path.write_text(json.dumps(_zeroed(json.loads(path.read_text()))))
            if any(not f.endswith(EXAMPLE_FILES) for f in inside):
                _reexport(root, model.name, version, directory)
            client.set_model_version_tag(model.name, version.version, ERASURE_TAG, "artifacts-rewritten")
            client.set_model_version_tag(model.name, version.version, "erasure_batch", batch_id)
            touched.append(f"{model.name} v{version.version}")
    return touched


def _reexport(root: Path, name: str, version, directory: Path) -> None:
    """The MLflow model files of ``version`` saved again from its weights, with a zero example."""
    import mlflow.pytorch

    from fedunlearn.config import load_params
    from fedunlearn.data.store import read_manifest
    from models import build_model

    state, tags = load_weights(root, name, version=version.version)
    cfg = load_params(Path(root) / "params.yaml").scenario(tags.get("scenario", name))
    manifest = read_manifest(tags.get("scenario", name), Path(root))
    model = build_model(cfg.model, tuple(manifest["input_shape"]), int(manifest["num_classes"]), l2=cfg.l2)
    model.load_state_dict(state)
    with tempfile.TemporaryDirectory(dir=Path(root) / ".tmp") as tmp, _EXPORT_LOCK:
        saved = Path(tmp) / "model"
        mlflow.pytorch.save_model(model.eval(), str(saved),
                                  input_example=input_example(tuple(manifest["input_shape"])).numpy(),
                                  pip_requirements=mlflow.pytorch.get_default_pip_requirements())
        for path in saved.rglob("*"):
            target = directory / path.relative_to(saved)
            if path.is_file() and path.name != "MLmodel" and target.exists():
                os.replace(path, target)
