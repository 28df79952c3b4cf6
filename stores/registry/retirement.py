"""Retiring a registered version: its weights leave every MLflow store, its record stays.

A retired version keeps its run (metrics, parameters, dataset inputs), its tags and description —
what ``fedunlearn compare`` and MLflow's compare view read — and gains a tombstone:

    retirement        retiring | retired      (retiring: the weights' deletion began; nothing may load it)
    retired_by        the batch whose exact forgetting retired it
    weights_sha256    the digest of its weights as they were (``stores.registry.weights.tree_digest``)
    retired_at        when the deletion finished
    _retired          "RETIRED by <batch> (weights deleted; metrics kept) ..." — on the version and its run:
                      MLflow's UI lists tags by key, and ``_`` sorts before every letter, so this one comes
                      first, beside the version's READY status and its Promote and alias buttons

and says so wherever a user meets it: the version's and the run's descriptions begin with the same
words, and MLflow's own model (``model/``) is replaced by a tombstone ``MLmodel`` whose model file is
named by the notice, so that ``mlflow.pytorch.load_model("models:/<model>/<n>")`` fails naming the
batch and what to load instead, not with a bare "No such artifact: 'MLmodel'".

The steps are ordered so that a process killed between any two resumes without harm: the keyed
windows of the weights (``fedunlearn.requests.erasure.remember_retired``) and the digest are written
before anything is deleted; the ``retiring`` tag before the deletion makes the version unloadable at
once; the deletion is of paths that may already be gone; ``retired`` comes last. A hold
(``hold`` tag) keeps a version's weights on purpose.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fedunlearn.errors import InputError
from fedunlearn.faults import RETIREMENT_FAILPOINT, failpoint
from fedunlearn.requests import erasure
from fedunlearn.requests.model import utc_now
from stores.registry.weights import MODEL_ARTIFACT, WEIGHTS, load_state, tree_digest

RETIREMENT_TAG, RETIRED_BY_TAG, WEIGHTS_HASH_TAG, HOLD_TAG = "retirement", "retired_by", "weights_sha256", "hold"
RETIRING, RETIRED = "retiring", "retired"
# Set instead of weights_sha256 when a version due to retire had no weights left to hash (removed outside
# fedunlearn): it retires all the same, recorded as gone, rather than failing every run that retires.
WEIGHTS_MISSING_TAG = "weights_missing"
NOTICE_TAG = "_retired"
NOTICE = "RETIRED by {batch} (weights deleted; metrics kept)"
WEIGHT_ARTIFACTS = (WEIGHTS, MODEL_ARTIFACT)  # the run's files that are the model; the budget is numbers about it


class VersionRetired(InputError):
    """A retired version was asked for its weights, or for an alias."""


def retired_batch(version) -> str | None:
    """The batch that retired ``version`` (an MLflow ModelVersion), or None while it has its weights."""
    return version.tags.get(RETIRED_BY_TAG) if version.tags.get(RETIREMENT_TAG) in (RETIRING, RETIRED) else None


def retired_error(version) -> VersionRetired:
    return VersionRetired(
        f"v{version.version} of {version.name} was retired by batch {retired_batch(version)}: weights deleted; use "
        f"models:/{version.name}@current (the version serving now). It ({version.tags.get('role', '?')}) learnt "
        "samples whose deletion that batch completed exactly; its metrics, tags and lineage stay: "
        f"`fedunlearn compare --scenario {version.name}`")


def retired_notice(name: str, batch_id: str) -> str:
    """The words a retired version's tag and descriptions begin with."""
    return (NOTICE.format(batch=batch_id) + f": do not promote, alias or load it; use models:/{name}@current")


def retired_description(name: str, batch_id: str, at: str, previous: str | None) -> str:
    """A retired version's (or run's) description: the notice first — the UI shows a description
    folded to its first line — then what it was, kept as it was written. Prefixed once."""
    if previous and previous.startswith(NOTICE.format(batch=batch_id)):
        return previous
    head = (f"{NOTICE.format(batch=batch_id)} at {at}: it learnt samples whose deletion `{batch_id}` completed "
            f"exactly. Load `models:/{name}@current` instead; `fedunlearn compare --scenario {name}` shows its record.")
    return head + (f"\n\nBefore its retirement: {previous}" if previous else "")


class Retirement:
    """The retiring half of ``Registry``: needs its ``root`` and ``client`` (``Runs``) and its
    ``_model_uri`` (``ArtifactRewriting``)."""

    root: Path
    client: Any
    uri: str

    def retire(self, name: str, version: str, batch_id: str) -> bool:
        """Delete the version's weights from the MLflow stores and leave its tombstone (module
        docstring); True when this call finished a retirement, False when it was done already."""
        found = self.client.get_model_version(name, version)
        if found.tags.get(RETIREMENT_TAG) == RETIRED:
            return False
        if found.tags.get(RETIREMENT_TAG) != RETIRING:  # a resumed retirement has them already: the weights are gone
            if WEIGHTS in {a.path for a in self.client.list_artifacts(found.run_id)}:
                known = (WEIGHTS_HASH_TAG, self._remember_weights(found))
            else:
                known = (WEIGHTS_MISSING_TAG, utc_now().isoformat(timespec="seconds"))
            for key, value in (known, (RETIRED_BY_TAG, batch_id), (RETIREMENT_TAG, RETIRING)):
                self.client.set_model_version_tag(name, version, key, value)
        for alias in [a for a, v in self.client.get_registered_model(name).aliases.items() if str(v) == str(version)]:
            self.client.delete_registered_model_alias(name, alias)
        self._delete_weights(found)
        failpoint(RETIREMENT_FAILPOINT)
        at = utc_now().isoformat(timespec="seconds")
        self._mark_retired(found, found.tags.get(RETIRED_BY_TAG) or batch_id, at)
        self.client.set_model_version_tag(name, version, "retired_at", at)
        self.client.set_model_version_tag(name, version, RETIREMENT_TAG, RETIRED)
        self.client.set_tag(found.run_id, RETIREMENT_TAG, f"{RETIRED} by {found.tags.get(RETIRED_BY_TAG) or batch_id}")
        return True

    def _mark_retired(self, found, batch_id: str, at: str) -> None:
        """The notice where a user meets the version: its tag and description, its run's, and the
        tombstone ``MLmodel`` (module docstring). Each step may run again after a kill."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NOTE

        name, notice = found.name, retired_notice(found.name, batch_id)
        self.client.set_model_version_tag(name, found.version, NOTICE_TAG, notice)
        self.client.set_tag(found.run_id, NOTICE_TAG, notice)
        self.client.update_model_version(name, found.version,
                                         description=retired_description(name, batch_id, at, found.description))
        previous = self.client.get_run(found.run_id).data.tags.get(MLFLOW_RUN_NOTE)
        self.client.set_tag(found.run_id, MLFLOW_RUN_NOTE, retired_description(name, batch_id, at, previous))
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            tombstone = Path(tmp) / "MLmodel"
            tombstone.write_text(tombstone_mlmodel(notice))
            get_artifact_repository(self._model_uri(found), tracking_uri=self.uri).log_artifact(str(tombstone))

    def _remember_weights(self, found) -> str:
        """The weights' digest, and their keyed windows in the workspace: read before anything goes."""
        owner = f"{found.name} v{found.version}"
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            local = Path(self.client.download_artifacts(found.run_id, WEIGHTS, tmp))
            tensors = [t.detach().contiguous().view(-1).numpy().tobytes() for path in sorted(local.rglob("*.pt"))
                       for t in load_state(path).values() if t.is_floating_point()]
            erasure.remember_retired(self.root, owner, erasure.weight_windows(erasure.fingerprint_key(self.root),
                                                                               owner, tensors))
            return tree_digest(local)

    def _delete_weights(self, found) -> None:
        """The run's weights and MLflow model, and a logged model's files where the version's source is
        one, through each store's artifact repository (local files, or the tracking server's proxy)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        run_uri = self.client.get_run(found.run_id).info.artifact_uri
        present = {a.path for a in self.client.list_artifacts(found.run_id)}
        # A tracking server's proxied store (mlflow-artifacts:) resolves through the workspace's URI,
        # not the process's global one.
        repository = get_artifact_repository(run_uri, tracking_uri=self.uri)
        for path in WEIGHT_ARTIFACTS:
            if path in present:
                repository.delete_artifacts(path)
        model_uri = self._model_uri(found)
        if not model_uri.startswith(f"{run_uri}/") and _exists(model_uri):
            get_artifact_repository(model_uri, tracking_uri=self.uri).delete_artifacts()

    def hold(self, name: str, version: str, reason: str) -> None:
        """Keep the version's weights on purpose (``reason``: a litigation hold, an audit)."""
        found = self.client.get_model_version(name, version)
        if retired_batch(found):
            raise retired_error(found)
        self.client.set_model_version_tag(name, version, HOLD_TAG, reason)
        self.client.set_model_version_tag(name, version, "hold_at", utc_now().isoformat(timespec="seconds"))


def tombstone_mlmodel(notice: str) -> str:
    """MLflow's model file for a retired version: its pytorch flavor names, as its model file, the
    notice — no such file exists, so MLflow's loader fails with the notice in its message."""
    import json

    import torch

    data = json.dumps(notice)  # a JSON string is a YAML string: the notice's colons stay text
    return (f"flavors:\n  pytorch:\n    model_data: {data}\n    pytorch_version: {json.dumps(torch.__version__)}\n"
            f"  python_function:\n    loader_module: mlflow.pytorch\n    data: {data}\n"
            f"metadata:\n  retired: {data}\n")


def _exists(uri: str) -> bool:
    location = urlparse(uri)
    return location.scheme not in ("", "file") or Path(location.path).exists()

