"""The figures of a model on one deletion batch's forget set, so that the original, the unlearned
and the retrained versions are compared on the same samples: what is measured (``figures``), on
which version's run it is shown as a plain metric (``shown_on_run``), its step there
(``batch_step``), and the comparison table's rows and header for one batch (``on_forget_set``,
``header``). Plain values: the tasks log and read them (``tasks.forget_sets``).

A version meets a batch's forget set in one of three parts (``part``): ``source`` (the batch
unlearned from it: it was trained on those samples), ``unlearned`` (an attempt of the batch) or
``retrained`` (trained from scratch without them: the batch's reference, or the exact retrain that
repaid its debt). Counts and figures only, never a sample ID."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from fedunlearn.evaluation.records import Evaluation

FORGET_SET_METRICS = ("forget_acc", "mia_auc", "audit_auc", "audit_auc_low", "audit_auc_high")
SOURCE, UNLEARNED, RETRAINED = "source", "unlearned", "retrained"
PARTS = (SOURCE, UNLEARNED, RETRAINED)
FORGET_SET_TAG = "forget_set"  # run tag: the batch whose forget set the run's plain forget metrics are on


def figures(evaluation: Evaluation, audit: Any | None) -> dict[str, float]:
    """Forget accuracy, the population attack's AUC and the per-example audit's AUC with its
    interval (NaN where the audit could not run), under the keys an unlearned version's run has."""
    low, high = audit.interval if audit is not None else (math.nan, math.nan)
    return {"forget_acc": float(evaluation.forget_acc), "mia_auc": float(evaluation.mia_auc),
            "audit_auc": float(audit.auc) if audit is not None else math.nan,
            "audit_auc_low": float(low), "audit_auc_high": float(high)}


def shown_on_run(role: str, part: str) -> bool:
    """Whether a version's figures on a batch's forget set become its run's plain metrics (what
    MLflow's compare view shows): for the original as a batch's source, for a retrained version as
    the model without the batch's samples. An unlearned version's run already holds its own batch's
    figures, and a version that is a later batch's source keeps the figures of its own role: those
    go to the batch's file only (``batches/<batch_id>/forget_set.json``)."""
    return (role, part) in (("original", SOURCE), ("retrained", RETRAINED))


def batch_step(batch_ids: Iterable[str], batch_id: str) -> int:
    """The batch's number among the scenario's batches (1 for the first; their IDs sort by creation
    time): the step its figures are logged at, so a run measured on several batches keeps each in
    its history and the compare view shows the latest batch's."""
    return sorted(set(batch_ids) | {batch_id}).index(batch_id) + 1


def on_forget_set(rows: list[dict[str, Any]], measured: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The comparison rows with the forget-set columns of one batch: ``measured`` maps a version
    (str) to its figures and ``part`` on that batch's forget set; a version not measured on it
    shows none, so that every figure in the forget-set columns is on the same samples."""
    shown = []
    for row in rows:
        found = measured.get(str(row["version"]), {})
        shown.append({**row, **{key: _finite(found.get(key)) for key in FORGET_SET_METRICS},
                      "forget_set_part": found.get("part")})
    return shown


def header(batch_id: str, samples: int | None, measured: Mapping[str, Mapping[str, Any]],
           rows: int | None = None) -> str:
    """The line above the comparison table: which forget set its forget-set columns are on, how
    each version measured there meets it, and (``rows``: the versions in the table) that the
    others show none."""
    what = {SOURCE: "its source, trained on them", UNLEARNED: "unlearned", RETRAINED: "retrained without them"}
    versions = sorted(measured.items(), key=lambda item: int(item[0]))
    parts = ", ".join(f"v{version} ({what.get(found.get('part'), found.get('part'))})" for version, found in versions)
    count = f" ({samples} samples)" if samples else ""
    others = "; – for the other versions" if rows is None or rows > len(measured) else ""
    return (f"forget_acc, mia_auc and audit_auc on the forget set of {batch_id}{count}: "
            + (parts or "no version was measured on it") + others + ".")


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value
