"""Rewriting registered versions' MLflow artifacts in place, for the erasure of deleted rows: the
input examples of versions registered before examples were zeros (``scrub_examples``), each
rewritten version tagged ``erasure`` (``ERASURE_TAG``), which ``fedunlearn compare`` shows."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from torch import nn

from stores.registry.retirement import retired_batch
from stores.registry.weights import save_mlflow_model

EXAMPLE_FILES = ("input_example.json", "serving_input_example.json")
ERASURE_TAG = "erasure"

# ``rebuild(model name, version)``: the version's module, from its own weights, and its input shape.
Rebuild = Callable[[str, str], tuple[nn.Module, tuple[int, ...]]]


class ArtifactRewriting:
    """The rewriting half of ``Registry``: needs its ``root``, ``uri`` and ``client`` (``Runs``)."""

    root: Path
    uri: str
    client: Any

    def scrub_examples(self, found_files: set[str], batch_id: str, rebuild: Rebuild) -> list[str]:
        """Rewrite, in place, the MLflow artifacts of every registered version that hold a deleted
        row (``found_files``, relative to the workspace) — the input examples of versions
        registered before they were zeros: the JSON examples with zeros of the same shape,
        ``data/model.pt2`` saved again from the version's own weights (``rebuild(name, version)``
        gives the module and its input shape) with a zero example. What the version serves does not
        change. Each rewritten version is tagged ``erasure=artifacts-rewritten`` (``erasure_batch``:
        this batch); one whose artifacts are not on this machine (a tracking server's) is read back:
        its examples all zeros, nothing to do; otherwise it is tagged ``erasure=contains-deleted-rows``,
        and ``fedunlearn compare`` shows the tag. Returns ``<model> v<version>`` for each."""
        touched = []
        versions = [v for model in self.client.search_registered_models()
                    for v in sorted(self.client.search_model_versions(f"name='{model.name}'"),
                                    key=lambda v: int(v.version))]
        for version in versions:
            if retired_batch(version):  # its model files are gone with its weights
                continue
            directory, local = self._model_directory(version)
            if not local:
                if self._examples_hold_data(version):
                    self.client.set_model_version_tag(version.name, version.version, ERASURE_TAG,
                                                      "contains-deleted-rows")
                    touched.append(f"{version.name} v{version.version}")
            elif self._rewrite(version, directory, {f for f in found_files if _within(self.root / f, directory)},
                               rebuild):
                self.client.set_model_version_tag(version.name, version.version, ERASURE_TAG, "artifacts-rewritten")
                self.client.set_model_version_tag(version.name, version.version, "erasure_batch", batch_id)
                touched.append(f"{version.name} v{version.version}")
        return touched

    def _rewrite(self, version, directory: Path, inside: set[str], rebuild: Rebuild) -> bool:
        """Zero the examples of a version stored on this machine and save its model again, when
        ``inside`` (the found files in its directory) is not empty."""
        if not inside:
            return False
        for name in EXAMPLE_FILES:
            path = directory / name
            if path.is_file():
                path.write_text(json.dumps(zeroed(json.loads(path.read_text()))))
        if any(not f.endswith(EXAMPLE_FILES) for f in inside):
            module, input_shape = rebuild(version.name, version.version)
            self._resave(module, input_shape, directory)
        return True

    def _model_uri(self, version) -> str:
        """The artifact URI of the version's MLflow model files."""
        source = version.source
        if source.startswith("models:/"):  # a logged model (MLflow 3's log_model)
            return self.client.get_logged_model(source.removeprefix("models:/")).artifact_location
        run_id, _, path = source.removeprefix("runs:/").partition("/")  # runs:/<run_id>/<path>
        return f"{self.client.get_run(run_id).info.artifact_uri}/{path}"

    def _model_directory(self, version) -> tuple[Path, bool]:
        """Where the version's MLflow model files are, and whether that is on this machine."""
        location = urlparse(self._model_uri(version))
        return Path(location.path), location.scheme in ("", "file")

    def _examples_hold_data(self, version) -> bool:
        """Whether the input examples of a version stored elsewhere (read back through the tracking
        server) hold anything but zeros — as versions registered before examples were zeros do."""
        import mlflow.artifacts

        uri = self._model_uri(version)
        present = {Path(f.path).name for f in mlflow.artifacts.list_artifacts(artifact_uri=uri, tracking_uri=self.uri)}
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            for name in EXAMPLE_FILES:
                if name in present:
                    local = mlflow.artifacts.download_artifacts(artifact_uri=f"{uri}/{name}", dst_path=tmp,
                                                                tracking_uri=self.uri)
                    document = json.loads(Path(local).read_text())
                    if document != zeroed(document):
                        return True
        return False

    def _resave(self, module: nn.Module, input_shape: tuple[int, ...], directory: Path) -> None:
        """MLflow's model files saved again over those in ``directory`` (its MLmodel kept)."""
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            saved = Path(tmp) / "model"
            save_mlflow_model(module, input_shape, saved)
            for path in saved.rglob("*"):
                target = directory / path.relative_to(saved)
                if path.is_file() and path.name != "MLmodel" and target.exists():
                    os.replace(path, target)


def zeroed(document: Any) -> Any:
    """The same JSON structure with every number 0 (the example's shape stays, its values go)."""
    if isinstance(document, dict):
        return {key: zeroed(value) for key, value in document.items()}
    if isinstance(document, list):
        return [zeroed(value) for value in document]
    return 0.0 if isinstance(document, (int, float)) and not isinstance(document, bool) else document


def _within(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())
