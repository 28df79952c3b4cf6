"""MLflow runs of one workspace: the client built with the workspace's explicit URIs, experiments,
runs (ended FAILED when their block raises), parameters, metrics, run artifacts and tags, and each
run's data version as an MLflow dataset input.

One client per workspace, built with explicit URIs (``sqlite:///<root>/mlflow/mlflow.db``; artifacts
under ``<root>/mlflow/artifacts``), or the tracking server that params.yaml names
(``mlflow.tracking_uri``; its experiments keep their artifacts where the server puts them) — never
MLflow's process-global tracking URI.

Lineage: every training, unlearning and retraining run has its data version as an MLflow dataset
input (``log_data_version``: metadata only — name ``partition@<scenario>``, digest the DVC content
hash, source the partition's path in the workspace, context ``training`` | ``unlearning`` |
``retraining`` | ``audit-reference``).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from fedunlearn.data.store import PARTITIONS_DIR

MAX_METRICS_PER_BATCH = 1000  # MLflow's limit for one log_batch

Steps = list[tuple[dict[str, float | None], int, int]]


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


def is_tracking_server(uri: str) -> bool:
    """An MLflow tracking server (it keeps the runs, the registry and, proxied, the artifacts) rather
    than a database or file store this process writes itself."""
    return urlparse(uri).scheme in ("http", "https", "databricks")


class Runs:
    """The workspace's MLflow client (``client``) and its runs; ``Registry`` adds the registered
    versions."""

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

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)

    # --- metrics ------------------------------------------------------------------------------

    def metrics(self, run_id: str) -> dict[str, float]:
        return self.client.get_run(run_id).data.metrics

    def log_metrics(self, run_id: str, metrics: dict[str, float | None], step: int | None = None) -> None:
        self.log_steps(run_id, [(metrics, step or 0, int(time.time() * 1000))])

    def log_steps(self, run_id: str, steps: Steps) -> None:
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
        ``interval_s`` seconds (default 10) and when the block ends, however it ends: not one MLflow
        transaction per round, and the MLflow UI still follows a long training."""
        pending: Steps = []
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

    # --- artifacts and tags -------------------------------------------------------------------

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

    def note(self, run_id: str, description: str) -> None:
        """The run's description (MLflow's run note), shown on the run's page beside its dataset input."""
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

        self.client.set_tag(run_id, MLFLOW_RUN_NOTE, description)

    # --- lineage ------------------------------------------------------------------------------

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
