"""MLflow for one workspace: runs, metrics and the model registry, through one client built with the
workspace's explicit URIs (never MLflow's process-global tracking URI). The package re-exports what
the rest of the code uses; each module holds one concern:

    runs.py       the MLflow client, experiments, runs (FAILED when their block raises), metrics,
                  run artifacts and tags, each run's data version as a dataset input
    weights.py    the weights layout of a version by setting, written and read back as plain state
                  dicts, and MLflow's own model (the pt2 export, its input example of zeros)
    versions.py   ``Registry``: registered versions, aliases, tags, descriptions, reading them back
    artifacts.py  rewriting registered versions' artifacts in place when they hold a deleted row
    retirement.py a retired version's weights deleted, its tombstone kept; holds
"""

from stores.registry.artifacts import ERASURE_TAG, EXAMPLE_FILES
from stores.registry.retirement import HOLD_TAG, VersionRetired, retired_batch
from stores.registry.runs import MAX_METRICS_PER_BATCH, is_tracking_server, tracking_uri
from stores.registry.versions import (ModelArtifactMissing, RegisteredModel, Registry, registered_batch_ids,
                                      version_ref)
from stores.registry.weights import (BUDGET_ARTIFACT, HFL_WEIGHTS, MODEL_ARTIFACT, WEIGHTS, ModelWeights,
                                     input_example, prepare_model_logging, save_mlflow_model)

__all__ = [
    "BUDGET_ARTIFACT", "ERASURE_TAG", "EXAMPLE_FILES", "HFL_WEIGHTS", "HOLD_TAG", "MAX_METRICS_PER_BATCH",
    "MODEL_ARTIFACT", "VersionRetired", "retired_batch",
    "WEIGHTS", "ModelArtifactMissing", "ModelWeights", "RegisteredModel", "Registry", "input_example",
    "is_tracking_server", "prepare_model_logging", "registered_batch_ids", "save_mlflow_model", "tracking_uri",
    "version_ref",
]
