"""MLflow: runs, metrics and the model registry of one workspace, through one client built with
explicit URIs (``sqlite:///<root>/mlflow/mlflow.db``; artifacts under ``<root>/mlflow/artifacts``),
or the tracking server that params.yaml names (``mlflow.tracking_uri``; its experiments keep their
artifacts where the server puts them) — never MLflow's process-global tracking URI.

Registry conventions: every version of the registered model ``<scenario>`` carries the tags
``role`` (original | retrained | unlearned), ``scenario``, ``setting``, ``data_version`` and
``certificate`` (its guarantee class); unlearned and batch-triggered retrained versions also
``batch_id``, unlearned ones ``method``, ``attempt`` and ``source_version``. Aliases:
``original`` (the trained model), ``retrained`` (the latest exact reference), ``current`` (the
version that serves).

Lineage: every training, unlearning and retraining run has its data version as an MLflow dataset
input (``log_data_version``: metadata only — name ``partition@<scenario>``, digest the DVC content
hash, source the partition's path in the workspace, context ``training`` | ``unlearning`` |
``retraining`` | ``audit-reference``), and every version a description of why it exists
(``describe``): the MLflow UI alone says what data a version saw and which batch put it there.

What a version stores, by setting — each a plain ``state_dict`` loaded with
``torch.load(..., weights_only=True)`` (nothing from the store is unpickled):

    hfl  weights/weights.pt                        the global model
    vfl  weights/party_<p>/bottom.pt               each party's bottom model: a party fetches its own alone
         weights/party_<p>/top.pt                  the active party's top model
    dfl  weights/weights.pt                        the published model (the nodes' average)
         weights/nodes/node_<i>.pt                 each node's local model
         certified_budget.json                     certified DFU's residual budget, carried to the next batch

plus MLflow's own model (``model/``: the model over full features, for serving), logged with an
input example of zeros — never user data, which would outlive its deletion in every version.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

import torch
from torch import nn

from fedunlearn.data.store import PARTITIONS_DIR
from fedunlearn.errors import StateDamaged
from fedunlearn.evaluation.records import VERSION_METRICS
from fedunlearn.receipts import ModelRef

WEIGHTS = "weights"
HFL_WEIGHTS = f"{WEIGHTS}/weights.pt"
BUDGET_ARTIFACT = "certified_budget.json"
MODEL_ARTIFACT = "model"
EXAMPLE_FILES = ("input_example.json", "serving_input_example.json")
ERASURE_TAG = "erasure"
MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch
# torch.export is not thread-safe (two exports at once fail: "SymInt ... is not tracked with
# proxy"): a probe saved in the background and a version being registered take turns.
_EXPORT_LOCK = threading.Lock()


def tracking_uri(root: Path) -> str:
    """The workspace's tracking (and registry) URI: ``mlflow.tracking_uri`` of its params.yaml, or its
    own store — on PostgreSQL once it was served there (``stores.postgres``), else
    ``sqlite:///<root>/mlflow/mlflow.db``. MLflow's process-global ``MLFLOW_TRACKING_URI`` is not read:
    every workspace names its store itself."""
    from fedunlearn.config import load_params
    from stores.postgres import mlflow_tracking_uri

    params = Path(root) / "params.yaml"
    configured = load_params(params).mlflow.tracking_uri if params.is_file() else None
    return (configured or mlflow_tracking_uri(root)
            or f"sqlite:///{(Path(root) / 'mlflow' / 'mlflow.db').resolve()}")


def registered_batch_ids(root: Path) -> set[str]:
    """``Registry.batch_ids`` of the workspace at ``root``, without a store directory when none exists
    yet (a workspace never trained has registered nothing)."""
    uri = tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return set()
    return Registry(root).batch_ids()


def is_tracking_server(uri: str) -> bool:
    """An MLflow tracking server (it keeps the runs, the registry and, proxied, the artifacts) rather
    than a database or file store this process writes itself."""
    return urlparse(uri).scheme in ("http", "https", "databricks")


def input_example(input_shape: tuple[int, ...]) -> torch.Tensor:
    """What MLflow stores as the model's example input: two rows of zeros, never user data."""
    return torch.zeros((2, *input_shape))


def save_mlflow_model(model: nn.Module, input_shape: tuple[int, ...], path: Path) -> None:
    """MLflow's pytorch model format (``data/model.pt2`` keeps the example it was exported with)."""
    import mlflow.pytorch

    # Named requirements: inferring them runs a subprocess that imports the model (~6 s per version).
    with _EXPORT_LOCK:
        mlflow.pytorch.save_model(model.to("cpu").eval(), str(path),
                                  input_example=input_example(input_shape).numpy(),
                                  pip_requirements=mlflow.pytorch.get_default_pip_requirements())


def prepare_model_logging() -> None:
    """Save a 2×2 probe model to a temporary directory. A process's first model save pays once for
    importing ``torch.export`` and MLflow's map of installed packages (~2.3 s of a 3.3 s
    registration, py-spy); run ahead in the background (``tasks.preload``), the registration that
    follows pays only for its own model. Local files only: no store is touched."""
    with tempfile.TemporaryDirectory() as tmp:
        save_mlflow_model(nn.Linear(2, 2), (2,), Path(tmp) / "probe")


class ModelArtifactMissing(StateDamaged):
    """A registered version's weights cannot be read back."""


@dataclass
class ModelWeights:
    """A version's weights as a federation holds them: ``state`` (the global model, or one state
    per party for VFL), the DFL nodes' local models and certified DFU's residual budget."""

    state: dict[str, Any]
    node_states: list[dict[str, torch.Tensor] | None] | None = None
    budget: dict[str, Any] | None = None

    def files(self, setting: str) -> dict[str, dict[str, torch.Tensor]]:
        """Artifact path → state dict (the layout in the module docstring)."""
        if setting == "vfl":
            files = {}
            for party, state in self.state.items():
                for part in ("bottom", "top"):
                    own = {k[len(part) + 1:]: v for k, v in state.items() if k.startswith(f"{part}.")}
                    if own:
                        files[f"{WEIGHTS}/{party}/{part}.pt"] = own
            return files
        files = {HFL_WEIGHTS: self.state}
        for node, state in enumerate(self.node_states or []):
            if state is not None:
                files[f"{WEIGHTS}/nodes/node_{node:03d}.pt"] = state
        return files


@dataclass
class RegisteredModel:
    ref: ModelRef
    tags: dict[str, str]
    weights: ModelWeights
    metrics: dict[str, float] = field(default_factory=dict)  # the latest value of each metric of its run

    @property
    def state(self) -> dict[str, Any]:
        return self.weights.state


def _cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu") for k, v in state.items()}


def version_ref(version) -> ModelRef:
    return ModelRef(version=str(version.version), role=version.tags.get("role", "?"),
                    data_version=version.tags.get("data_version"), run_id=version.run_id)


class Registry:
    """The workspace's MLflow store. One instance per workspace (``Workspace.registry``)."""

    def __init__(self, root: Path):
        from mlflow import MlflowClient

        from stores.postgres import serves_workspace_store

        self.root = Path(root)
        (self.root / "mlflow").mkdir(exist_ok=True)
        self.uri = tracking_uri(self.root)
        # A tracking server elsewhere keeps the artifacts; the one `make serve` runs over this workspace's
        # PostgreSQL store leaves them in mlflow/artifacts, as the workspace's own store does.
        self.server = is_tracking_server(self.uri) and not serves_workspace_store(self.root, self.uri)
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def batch_ids(self) -> set[str]:
        """The ``batch_id`` tags of every registered version: the batches a model was unlearned or
        retrained for, which the ledger checks take as evidence that a batch was applied."""
        return {v.tags["batch_id"] for v in self.client.search_model_versions("") if v.tags.get("batch_id")}

    # --- runs ---------------------------------------------------------------------------------

    def experiment_id(self, name: str) -> str:
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        if self.server:  # the server's artifact store (proxied: mlflow-artifacts:/), not this machine's disk
            return self.client.create_experiment(name)
        location = (self.root / "mlflow" / "artifacts" / name).resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def start_run(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> str:
        from mlflow.entities import Param

        run = self.client.create_run(self.experiment_id(experiment), run_name=run_name,
                                     tags={k: str(v) for k, v in tags.items()})
        # One transaction for all of them rather than a sqlite write per parameter.
        self.client.log_batch(run.info.run_id, params=[Param(key, str(value)[:6000]) for key, value in params.items()])
        return run.info.run_id

    @contextmanager
    def run(self, experiment: str, run_name: str, params: dict[str, Any], tags: dict[str, str]) -> Iterator[str]:
        """A new run (``start_run``) for the block: ended FINISHED when the block ends, FAILED when it raises
        (``failed_on_error``)."""
        run_id = self.start_run(experiment, run_name, params, tags)
        with self.failed_on_error(run_id):
            yield run_id
        self.end_run(run_id)

    @contextmanager
    def failed_on_error(self, run_id: str) -> Iterator[None]:
        """Ends ``run_id`` as FAILED if the block raises (the block's error propagates unchanged): a run
        started with ``start_run`` would otherwise stay RUNNING in the MLflow UI for ever. Ending it may
        fail too (a full disk under the tracking database): that is logged, the block's error raised."""
        try:
            yield
        except BaseException:
            try:
                self.end_run(run_id, "FAILED")
            except Exception as err:
                logging.getLogger(__name__).warning("could not end MLflow run %s as FAILED: %s", run_id, err)
            raise

    def open_runs(self, experiment: str) -> list[str]:
        """The IDs of the experiment's runs still RUNNING."""
        experiment_id = self.client.get_experiment_by_name(experiment)
        if experiment_id is None:
            return []
        return [run.info.run_id for run in self.client.search_runs([experiment_id.experiment_id],
                                                                   "attributes.status = 'RUNNING'")]

    def log_metrics(self, run_id: str, metrics: dict[str, float | None], step: int | None = None) -> None:
        self.log_steps(run_id, [(metrics, step or 0, int(time.time() * 1000))])

    def log_steps(self, run_id: str, steps: list[tuple[dict[str, float | None], int, int]]) -> None:
        """Metrics of several steps, each ``(metrics, step, timestamp in ms)``, in as few transactions as
        MLflow allows (1,000 metrics each)."""
        from mlflow.entities import Metric

        entities = [Metric(key, float(value), stamp, step) for metrics, step, stamp in steps
                    for key, value in metrics.items() if value is not None]
        for start in range(0, len(entities), MAX_METRICS_PER_BATCH):
            self.client.log_batch(run_id, metrics=entities[start:start + MAX_METRICS_PER_BATCH])

    @contextmanager
    def step_metrics(self, run_id: str, interval_s: float = 10.0) -> Iterator[Callable[[dict[str, float | None], int],
                                                                                       None]]:
        """A function that logs a step's metrics (a training round's), written at most every
        ``interval_s`` seconds (default 10) and when the block ends, however it ends: a retrain's 20
        rounds were 20 MLflow transactions (0.06 s of a served deletion batch, py-spy), and the MLflow UI still
        follows a long training."""
        pending: list[tuple[dict[str, float | None], int, int]] = []
        written = time.monotonic()

        def log(metrics: dict[str, float | None], step: int) -> None:
            nonlocal written
            pending.append((metrics, step, int(time.time() * 1000)))
            if time.monotonic() - written >= interval_s:
                self.log_steps(run_id, pending)
                pending.clear()
                written = time.monotonic()

        try:
            yield log
        finally:
            self.log_steps(run_id, pending)

    def log_text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def text(self, run_id: str, name: str) -> str | None:
        """A text artifact of the run, or None if it has none by that name."""
        if name not in {a.path for a in self.client.list_artifacts(run_id)}:
            return None
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            return Path(self.client.download_artifacts(run_id, name, tmp)).read_text()

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def set_run_tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def log_data_version(self, run_id: str, scenario: str, data_version: str, context: str,
                         partition: str | None = None) -> None:
        """The run's data as an MLflow dataset input: the scenario's partition (``partition``, a path
        relative to the workspace; default ``data/partitions/<scenario>``, the output of DVC stage
        ``partition@<scenario>``) at ``data_version``, the DVC content hash, as the digest. Metadata
        only: no row, no sample ID. Logging the same input again changes nothing."""
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.data.sources import LocalArtifactDatasetSource
        from mlflow.entities import Dataset, DatasetInput, InputTag
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        source = LocalArtifactDatasetSource(partition or (PARTITIONS_DIR / scenario).as_posix())
        dataset = MetaDataset(source, name=f"partition@{scenario}", digest=data_version)
        self.client.log_inputs(run_id, datasets=[DatasetInput(Dataset(**dataset.to_dict()),
                                                              tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])])

    def data_inputs(self, run_id: str) -> list[tuple[str, str, str | None]]:
        """The run's dataset inputs: (digest, source path, context) each."""
        from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

        found = []
        for entry in self.client.get_run(run_id).inputs.dataset_inputs:
            context = next((t.value for t in entry.tags if t.key == MLFLOW_DATASET_CONTEXT), None)
            found.append((entry.dataset.digest, json.loads(entry.dataset.source).get("uri", ""), context))
        return found

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    def metrics(self, run_id: str) -> dict[str, float]:
        return self.client.get_run(run_id).data.metrics

    # --- versions -----------------------------------------------------------------------------

    def register(self, run_id: str, name: str, setting: str, weights: ModelWeights, model: nn.Module,
                 input_shape: tuple[int, ...], tags: dict[str, str], alias: str | None = None,
                 description: str | None = None) -> ModelRef:
        """Store the weights (by setting) and MLflow's model on the run, register them as a new
        version of ``name`` with ``tags`` and ``description`` (in the same call that creates it: a
        process killed in between leaves no untagged version a re-run could not recognise), set
        ``alias``."""
        tags = {k: str(v) for k, v in {**tags, "setting": setting}.items()}
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            staged = Path(tmp)
            for relative, state in weights.files(setting).items():
                (staged / relative).parent.mkdir(parents=True, exist_ok=True)
                torch.save(_cpu(state), staged / relative)
            if weights.budget is not None:
                (staged / BUDGET_ARTIFACT).write_text(json.dumps(weights.budget, indent=2, sort_keys=True))
            save_mlflow_model(model, input_shape, staged / MODEL_ARTIFACT)
            self.client.log_artifacts(run_id, str(staged))
        version = self.create_version(name, run_id, MODEL_ARTIFACT, tags, description)
        if description is not None:
            self._note(run_id, description)
        if alias:
            self.set_alias(name, alias, version)
        return ModelRef(version=version, role=tags["role"], data_version=tags.get("data_version"), run_id=run_id)

    def create_version(self, name: str, run_id: str, artifact_path: str, tags: dict[str, str],
                       description: str | None = None) -> str:
        """A new version of ``name`` (created if new) from the run's ``artifact_path``, tagged and
        described in the same call."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException:
            pass  # it exists
        return str(self.client.create_model_version(name, f"runs:/{run_id}/{artifact_path}", run_id=run_id,
                                                    tags={k: str(v) for k, v in tags.items()},
                                                    description=description).version)

    def version(self, name: str, version: str):
        return self.client.get_model_version(name, version)

    def by_alias(self, name: str, alias: str):
        """The model version behind ``name@alias``, or None."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version_by_alias(name, alias)
        except MlflowException:
            return None

    def alias_ref(self, name: str, alias: str) -> ModelRef | None:
        found = self.by_alias(name, alias)
        return version_ref(found) if found is not None else None

    def aliases(self, name: str) -> dict[str, str]:
        from mlflow.exceptions import MlflowException

        try:
            return {alias: str(v) for alias, v in self.client.get_registered_model(name).aliases.items()}
        except MlflowException:
            return {}

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.client.set_registered_model_alias(name, alias, version)

    def describe(self, name: str, version: str, description: str) -> None:
        """Set the version's description (markdown, shown on its page in the MLflow UI) and its
        run's, which the run's page shows beside the run's dataset input."""
        self.client.update_model_version(name, version, description=description)
        self._note(self.version(name, version).run_id, description)

    def _note(self, run_id: str, description: str) -> None:
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

        self.client.set_tag(run_id, MLFLOW_RUN_NOTE, description)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.client.set_model_version_tag(name, version, key, value)

    def remove_alias(self, name: str, alias: str) -> None:
        if self.by_alias(name, alias) is not None:
            self.client.delete_registered_model_alias(name, alias)

    def versions(self, name: str, **tags: str) -> list:
        """Versions of ``name`` with all ``tags``, oldest first."""
        query = " and ".join([f"name='{name}'"] + [f"tags.{k}='{v}'" for k, v in tags.items()])
        return sorted(self.client.search_model_versions(query), key=lambda v: int(v.version))

    def load(self, name: str, version: str | None = None, *, alias: str | None = None) -> RegisteredModel:
        """A version with its weights as the federation holds them (``ModelWeights``)."""
        found = self.version(name, version) if version is not None else self.by_alias(name, alias)
        setting = found.tags.get("setting", "hfl")
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            try:
                local = Path(self.client.download_artifacts(found.run_id, WEIGHTS, tmp))
                weights = _read_weights(setting, local)
                if setting == "dfl":
                    weights.budget = self._budget(found.run_id, tmp)
            except (OSError, RuntimeError, ValueError) as err:
                raise self._missing(name, found, err) from err
            except Exception as err:  # MlflowException: the artifact is not there
                if type(err).__name__ != "MlflowException":
                    raise
                raise self._missing(name, found, err) from err
        return RegisteredModel(version_ref(found), dict(found.tags), weights, self.metrics(found.run_id))

    def load_party(self, name: str, version: str, party: str) -> dict[str, dict[str, torch.Tensor]]:
        """One VFL party's own models (``bottom``, and ``top`` for the active party), nothing else."""
        found = self.version(name, version)
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            local = Path(self.client.download_artifacts(found.run_id, f"{WEIGHTS}/{party}", tmp))
            return {path.stem: torch.load(path, map_location="cpu", weights_only=True)
                    for path in sorted(local.glob("*.pt"))}

    def _budget(self, run_id: str, tmp: str) -> dict[str, Any] | None:
        names = {a.path for a in self.client.list_artifacts(run_id)}
        if BUDGET_ARTIFACT not in names:
            return None
        return json.loads(Path(self.client.download_artifacts(run_id, BUDGET_ARTIFACT, tmp)).read_text())

    def _missing(self, name: str, found, err: Exception) -> ModelArtifactMissing:
        detail = str(err).splitlines()[0] if str(err) else "no detail"
        return ModelArtifactMissing(
            f"{name} v{found.version} (run {found.run_id}, role {found.tags.get('role', '?')}): its weights "
            f"({HFL_WEIGHTS} or {WEIGHTS}/...) cannot be read from "
            f"{self.client.get_run(found.run_id).info.artifact_uri} "
            f"({type(err).__name__}: {detail}). Restore the artifact, or register a new model on the current data "
            f"version with `fedunlearn retrain --scenario {name}` and run the command again")

    def table(self, name: str) -> list[dict[str, Any]]:
        """Every registered version of ``name``, oldest first: aliases, tags and the version metrics
        of its run — what ``fedunlearn compare`` prints."""
        from mlflow.exceptions import MlflowException

        try:
            aliases = self.client.get_registered_model(name).aliases  # search results leave aliases out
        except MlflowException:
            raise ValueError(f"no registered model {name!r} in {self.uri}: train it with "
                             f"`fedunlearn train --scenario {name}`") from None
        rows = []
        for version in self.versions(name):
            metrics = self.metrics(version.run_id)
            rows.append({"version": int(version.version),
                         "aliases": ",".join(a for a, n in sorted(aliases.items()) if str(n) == str(version.version)),
                         "role": version.tags.get("role"), "method": version.tags.get("method", _trainer(version)),
                         "data_version": (version.tags.get("data_version") or "")[:10],
                         "batch_id": version.tags.get("batch_id"),
                         **{key: _finite(metrics.get(key)) for key in VERSION_METRICS},
                         "bd_asr": _finite(metrics.get("bd_asr")),
                         "certificate": version.tags.get("certificate"),
                         "erasure": version.tags.get(ERASURE_TAG, "")})
        return rows

    # --- versions registered before input examples were zeros ---------------------------------

    def scrub_examples(self, found_files: set[str], batch_id: str, rebuild) -> list[str]:
        """Rewrite, in place, the MLflow artifacts of every registered version that hold a deleted
        row (``found_files``, relative to the workspace) — the input examples of versions
        registered before they were zeros: the JSON examples with zeros of the same shape,
        ``data/model.pt2`` saved again from the version's own weights (``rebuild(version)`` gives
        the module and its input shape) with a zero example. What the version serves does not
        change. Each rewritten version is tagged ``erasure=artifacts-rewritten`` (``erasure_batch``:
        this batch); one whose artifacts are not on this machine (a tracking server's) is read back:
        its examples all zeros, nothing to do; otherwise it is tagged ``erasure=contains-deleted-rows``,
        and ``fedunlearn compare`` shows the tag. Returns ``<model> v<version>`` for each."""
        touched = []
        for model in self.client.search_registered_models():
            for version in self.versions(model.name):
                directory, local = self._model_directory(version)
                if not local:
                    if not self._examples_hold_data(version):
                        continue
                    self.set_version_tag(model.name, version.version, ERASURE_TAG, "contains-deleted-rows")
                    touched.append(f"{model.name} v{version.version}")
                    continue
                inside = {f for f in found_files if _within(self.root / f, directory)}
                if not inside:
                    continue
                for name in EXAMPLE_FILES:
                    path = directory / name
                    if path.is_file():
                        path.write_text(json.dumps(_zeroed(json.loads(path.read_text()))))
                if any(not f.endswith(EXAMPLE_FILES) for f in inside):
                    module, input_shape = rebuild(model.name, version.version)
                    self._resave(module, input_shape, directory)
                self.set_version_tag(model.name, version.version, ERASURE_TAG, "artifacts-rewritten")
                self.set_version_tag(model.name, version.version, "erasure_batch", batch_id)
                touched.append(f"{model.name} v{version.version}")
        return touched

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
                    if document != _zeroed(document):
                        return True
        return False

    def _resave(self, module: nn.Module, input_shape: tuple[int, ...], directory: Path) -> None:
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            saved = Path(tmp) / "model"
            save_mlflow_model(module, input_shape, saved)
            for path in saved.rglob("*"):
                target = directory / path.relative_to(saved)
                if path.is_file() and path.name != "MLmodel" and target.exists():
                    os.replace(path, target)


def _read_weights(setting: str, local: Path) -> ModelWeights:
    def load(path: Path) -> dict[str, torch.Tensor]:
        return torch.load(path, map_location="cpu", weights_only=True)

    if setting == "vfl":
        state = {}
        for party in sorted(p for p in local.iterdir() if p.is_dir()):
            state[party.name] = {f"{part.stem}.{k}": v for part in sorted(party.glob("*.pt"))
                                 for k, v in load(part).items()}
        if not state:
            raise FileNotFoundError(f"no party weights under {local}")
        return ModelWeights(state)
    weights = ModelWeights(load(local / "weights.pt"))
    nodes = sorted((local / "nodes").glob("node_*.pt")) if (local / "nodes").is_dir() else []
    if nodes:
        count = int(nodes[-1].stem.removeprefix("node_")) + 1
        by_index = {int(p.stem.removeprefix("node_")): load(p) for p in nodes}
        weights.node_states = [by_index.get(i) for i in range(count)]
    return weights


def _zeroed(document: Any) -> Any:
    """The same JSON structure with every number 0 (the example's shape stays, its values go)."""
    if isinstance(document, dict):
        return {key: _zeroed(value) for key, value in document.items()}
    if isinstance(document, list):
        return [_zeroed(value) for value in document]
    return 0.0 if isinstance(document, (int, float)) and not isinstance(document, bool) else document


def _within(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


def _finite(value: float | None) -> float | None:
    """None for a metric nobody measured (NaN): JSON and Prefect tables have no NaN."""
    return None if value is None or math.isnan(value) else value


def _trainer(version) -> str:
    return {"vfl": "split-nn", "dfl": "d-psgd"}.get(version.tags.get("setting", "hfl"), "fedavg")
