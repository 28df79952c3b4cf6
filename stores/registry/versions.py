"""The registered versions of a workspace's models: ``Registry`` (``Runs`` plus versions) registers
weights as a new version, reads versions back, and keeps their aliases, tags and descriptions.

Registry conventions: every version of the registered model ``<scenario>`` carries the tags
``role`` (original | retrained | unlearned), ``scenario``, ``setting``, ``data_version`` and
``certificate`` (its guarantee class); unlearned and batch-triggered retrained versions also
``batch_id``, unlearned ones ``method``, ``attempt`` and ``source_version``. Each version's run is
named by role and version (``run_name``). Aliases:
``original`` (the trained model), ``retrained`` (the latest exact reference), ``current`` (the
version that serves). Every version has a description of why it exists (``describe``), also set as
its run's note: with the run's dataset input (``Runs.log_data_version``) the MLflow UI alone says
what data a version saw and which batch put it there.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedunlearn.errors import StateDamaged
from fedunlearn.evaluation.records import VERSION_METRICS
from fedunlearn.receipts import ModelRef
from stores.registry.artifacts import ERASURE_TAG, ArtifactRewriting
from stores.registry.retirement import HOLD_TAG, Retirement, retired_batch, retired_error
from stores.registry.runs import Runs, tracking_uri
from stores.registry.weights import (BUDGET_ARTIFACT, HFL_WEIGHTS, MODEL_ARTIFACT, WEIGHTS, ModelWeights, read_party,
                                     read_weights, write_version_files)


class ModelArtifactMissing(StateDamaged):
    """A registered version's weights cannot be read back."""


@dataclass
class RegisteredModel:
    ref: ModelRef
    tags: dict[str, str]
    weights: ModelWeights
    metrics: dict[str, float] = field(default_factory=dict)  # the latest value of each metric of its run

    @property
    def state(self) -> dict[str, Any]:
        return self.weights.state


def version_ref(version) -> ModelRef:
    return ModelRef(version=str(version.version), role=version.tags.get("role", "?"),
                    data_version=version.tags.get("data_version"), run_id=version.run_id)


def run_name(role: str, version: str, scenario: str, tags: dict[str, str]) -> str:
    """A registered version's run name, by role and version: ``original v1 · mnist5k-hfl``,
    ``unlearned v2 (puf-special) · batch-…``, ``retrained v3 · mnist5k-hfl`` (a batch's own
    reference: ``· batch-…``). Only known once the version is: the run is renamed at registration."""
    method = f" ({tags['method']})" if role == "unlearned" and tags.get("method") else ""
    return f"{role} v{version}{method} · {tags.get('batch_id') or scenario}"


def registered_batch_ids(root: Path) -> set[str]:
    """``Registry.batch_ids`` of the workspace at ``root``, without a store directory when none exists
    yet (a workspace never trained has registered nothing)."""
    uri = tracking_uri(root)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return set()
    return Registry(root).batch_ids()


class Registry(Runs, ArtifactRewriting, Retirement):
    """The workspace's MLflow store: its runs (``Runs``), its registered versions, the rewriting
    of their artifacts (``ArtifactRewriting``) and their retirement (``Retirement``). One instance per
    workspace (``Workspace.registry``)."""

    def batch_ids(self) -> set[str]:
        """The ``batch_id`` tags of every registered version: the batches a model was unlearned or
        retrained for, which the ledger checks take as evidence that a batch was applied."""
        return {v.tags["batch_id"] for v in self.client.search_model_versions("") if v.tags.get("batch_id")}

    # --- registering --------------------------------------------------------------------------

    def register(self, run_id: str, name: str, setting: str, weights: ModelWeights, model: nn.Module,
                 input_shape: tuple[int, ...], tags: dict[str, str], alias: str | None = None,
                 description: str | None = None) -> ModelRef:
        """Store the weights (by setting) and MLflow's model on the run, register them as a new
        version of ``name`` with ``tags`` and ``description`` (in the same call that creates it: a
        process killed in between leaves no untagged version a re-run could not recognise), set
        ``alias``."""
        tags = {k: str(v) for k, v in {**tags, "setting": setting}.items()}
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            write_version_files(Path(tmp), setting, weights, model, input_shape)
            self.client.log_artifacts(run_id, tmp)
        version = self.create_version(name, run_id, MODEL_ARTIFACT, tags, description)
        self.client.update_run(run_id, name=run_name(tags["role"], version, name, tags))
        if description is not None:
            self.note(run_id, description)
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

    # --- versions, aliases, tags, descriptions ------------------------------------------------

    def version(self, name: str, version: str):
        return self.client.get_model_version(name, version)

    def versions(self, name: str, **tags: str) -> list:
        """Versions of ``name`` with all ``tags``, oldest first."""
        query = " and ".join([f"name='{name}'"] + [f"tags.{k}='{v}'" for k, v in tags.items()])
        return sorted(self.client.search_model_versions(query), key=lambda v: int(v.version))

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
        """Point ``alias`` at ``version``; never at a retired one (it has no weights to serve)."""
        found = self.version(name, version)
        if retired_batch(found):
            raise retired_error(found)
        self.client.set_registered_model_alias(name, alias, version)

    def remove_alias(self, name: str, alias: str) -> None:
        if self.by_alias(name, alias) is not None:
            self.client.delete_registered_model_alias(name, alias)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.client.set_model_version_tag(name, version, key, value)

    def describe(self, name: str, version: str, description: str) -> None:
        """Set the version's description (markdown, shown on its page in the MLflow UI) and its
        run's, which the run's page shows beside the run's dataset input."""
        self.client.update_model_version(name, version, description=description)
        self.note(self.version(name, version).run_id, description)

    # --- reading versions back ----------------------------------------------------------------

    def load(self, name: str, version: str | None = None, *, alias: str | None = None) -> RegisteredModel:
        """A version with its weights as the federation holds them (``ModelWeights``)."""
        found = self.version(name, version) if version is not None else self.by_alias(name, alias)
        if retired_batch(found):
            raise retired_error(found)
        setting = found.tags.get("setting", "hfl")
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            try:
                local = Path(self.client.download_artifacts(found.run_id, WEIGHTS, tmp))
                weights = read_weights(setting, local)
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
        if retired_batch(found):
            raise retired_error(found)
        with tempfile.TemporaryDirectory(dir=self.root / ".tmp") as tmp:
            return read_party(Path(self.client.download_artifacts(found.run_id, f"{WEIGHTS}/{party}", tmp)))

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
                         "erasure": version.tags.get(ERASURE_TAG, ""), "retired": _retirement(version)})
        return rows


def _retirement(version) -> str:
    """``retired by <batch>`` (weights deleted), ``held: <reason>``, or empty."""
    batch = retired_batch(version)
    if batch:
        return f"retired by {batch}"
    return f"held: {version.tags[HOLD_TAG]}" if version.tags.get(HOLD_TAG) else ""


def _finite(value: float | None) -> float | None:
    """None for a metric nobody measured (NaN): JSON and Prefect tables have no NaN."""
    return None if value is None or math.isnan(value) else value


def _trainer(version) -> str:
    return {"vfl": "split-nn", "dfl": "d-psgd"}.get(version.tags.get("setting", "hfl"), "fedavg")
