"""A version's figures on a deletion batch's forget set in MLflow (``fedunlearn.evaluation.forget_sets``),
and reading them back for ``fedunlearn compare``: each measurement is the file
``batches/<batch_id>/forget_set.json`` of the version's run (the figures, the part the version
plays, the number of samples: never a sample ID); where it is the run's own comparison — the
original as a batch's source, a retrained version without the batch's samples — also the run's
metrics under the unlearned runs' keys, at the batch's step, and the run tag ``forget_set``."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

from fedunlearn.evaluation.forget_sets import (FORGET_SET_METRICS, FORGET_SET_TAG, UNLEARNED, batch_step,
                                               shown_on_run)
from fedunlearn.receipts import ModelRef, read_receipts
from fedunlearn.requests.batch import load_records
from stores.workspace import Workspace

FILE = "forget_set.json"


def artifact_dir(batch_id: str) -> str:
    return f"batches/{batch_id}"


def log_forget_set(ws: Workspace, scenario: str, ref: ModelRef, batch_id: str, part: str, figures: dict[str, float],
                   samples: int, verdict: str | None = None) -> None:
    """``ref``'s ``figures`` on the forget set of ``batch_id`` (``samples`` rows), as the ``part``
    it plays there. Logging the same batch again rewrites its file."""
    registry = ws.registry
    document = {"batch_id": batch_id, "version": ref.version, "role": ref.role, "part": part, "samples": samples,
                "audit_verdict": verdict, **{k: None if math.isnan(v) else v for k, v in figures.items()}}
    with tempfile.TemporaryDirectory(dir=ws.temporary_dir) as tmp:
        path = Path(tmp) / FILE
        path.write_text(json.dumps(document, indent=2, allow_nan=False))
        registry.log_artifact(ref.run_id, path, artifact_dir(batch_id))
    if shown_on_run(ref.role, part):
        batches = [r.batch_id for r in load_records(ws.folders) if r.scenario == scenario]
        registry.log_metrics(ref.run_id, figures, step=batch_step(batches, batch_id))
        registry.set_run_tag(ref.run_id, FORGET_SET_TAG, batch_id)
        if verdict is not None:
            registry.set_run_tag(ref.run_id, "audit_verdict", verdict)


def latest_batch(ws: Workspace, scenario: str) -> tuple[str, int] | None:
    """The scenario's newest batch with a receipt and the number of training samples it forgot."""
    receipts = read_receipts(ws.root, scenario)
    if not receipts:
        return None
    last = receipts[-1]
    return last.batch_id, sum(last.forgotten_per_client.values())


def measured_on(ws: Workspace, scenario: str, batch_id: str) -> dict[str, dict[str, Any]]:
    """Every version measured on the forget set of ``batch_id``: its figures and part, by version.
    The batch's own attempts from their runs' metrics; the others from their runs' file of the batch."""
    registry = ws.registry
    found: dict[str, dict[str, Any]] = {}
    for version in registry.versions(scenario):
        if version.tags.get("role") == UNLEARNED and version.tags.get("batch_id") == batch_id:
            metrics = registry.metrics(version.run_id)
            found[str(version.version)] = {"part": UNLEARNED, **{k: metrics.get(k) for k in FORGET_SET_METRICS}}
            continue
        names = {a.path for a in registry.client.list_artifacts(version.run_id, artifact_dir(batch_id))}
        if f"{artifact_dir(batch_id)}/{FILE}" not in names:
            continue
        with tempfile.TemporaryDirectory(dir=ws.temporary_dir) as tmp:
            local = registry.client.download_artifacts(version.run_id, f"{artifact_dir(batch_id)}/{FILE}", tmp)
            document = json.loads(Path(local).read_text())
        found[str(version.version)] = {"part": document["part"], "samples": document.get("samples"),
                                       **{k: document.get(k) for k in FORGET_SET_METRICS}}
    return found
