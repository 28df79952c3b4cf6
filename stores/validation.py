"""Great Expectations suites over partitions: a failed expectation stops the flow and lists
what failed. Uses an ephemeral GX context (nothing written to disk)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedunlearn.data.store import PARTITIONS_DIR, read_manifest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


class ValidationFailed(RuntimeError):
    """Raised with one line per failed expectation."""


@dataclass
class Failure:
    expectation: str
    column: str | None
    unexpected_count: int | None
    examples: list

    def __str__(self) -> str:
        examples = f" e.g. {self.examples[:5]}" if self.examples else ""
        return f"{self.expectation} on {self.column}: {self.unexpected_count} unexpected{examples}"


def finite_rows(features: np.ndarray) -> np.ndarray:
    """Per sample, whether every feature is finite (an emptied client has zero rows)."""
    return np.isfinite(features.reshape(len(features), int(np.prod(features.shape[1:])))).all(axis=1)


def partition_frames(scenario: str, root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rows (one per sample: split, sample_id, label, finite) and counts (split vs manifest)."""
    manifest = read_manifest(scenario, root)
    base = root / PARTITIONS_DIR / scenario
    rows, counts = [], []
    if manifest["setting"] == "vfl":
        active = base / f"party_{manifest['parties'][-1]['party']:03d}"
        labels = np.load(active / "labels.npy")
        finite = np.ones(len(labels), dtype=bool)
        for party in manifest["parties"]:
            directory = base / f"party_{party['party']:03d}"
            ids = np.load(directory / "sample_ids.npy")
            features = np.load(directory / "features.npy")
            finite &= finite_rows(features)
            counts.append({"split": f"party_{party['party']}", "rows": len(ids), "manifest_count": party["num_samples"],
                           "aligned": bool(np.array_equal(ids, np.load(active / "sample_ids.npy")))})
        rows.append(pd.DataFrame({"split": "train", "sample_id": ids, "label": labels, "finite": finite}))
        splits = [("test", base / "test", manifest["test"]["num_samples"])]
    else:
        splits = [(f"client_{c['client']}", base / f"client_{c['client']:03d}", c["num_samples"])
                  for c in manifest["clients"]]
        splits.append(("test", base / "test", manifest["test"]["num_samples"]))
    for name, directory, expected in splits:
        ids = np.load(directory / "sample_ids.npy")
        features = np.load(directory / "features.npy")
        rows.append(pd.DataFrame({"split": name, "sample_id": ids, "label": np.load(directory / "labels.npy"),
                                  "finite": finite_rows(features)}))
        counts.append({"split": name, "rows": len(ids), "manifest_count": expected, "aligned": True})
    return pd.concat(rows, ignore_index=True), pd.DataFrame(counts)


def validate_frame(frame: pd.DataFrame, name: str, expectations: list) -> list[Failure]:
    """The expectations that ``frame`` fails, run as one Great Expectations suite ``<name>-suite``
    in an ephemeral context; empty when all pass."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch = (context.data_sources.add_pandas(f"{name}-source").add_dataframe_asset(name)
             .add_batch_definition_whole_dataframe(name).get_batch(batch_parameters={"dataframe": frame}))
    suite = context.suites.add(gx.ExpectationSuite(name=f"{name}-suite", expectations=expectations))
    result = batch.validate(suite)
    return [Failure(r.expectation_config.type, r.expectation_config.kwargs.get("column")
                    or r.expectation_config.kwargs.get("column_A"),
                    r.result.get("unexpected_count"), list(r.result.get("partial_unexpected_list") or []))
            for r in result.results if not r.success]


def validate_partition(scenario: str, root: Path) -> dict:
    """Sample IDs unique and disjoint across clients and test, labels in range, no NaN/inf,
    counts equal to the manifest (and VFL parties aligned on the same IDs)."""
    import great_expectations as gx

    manifest = read_manifest(scenario, root)
    rows, counts = partition_frames(scenario, root)
    failures = validate_frame(rows, "samples", [
        gx.expectations.ExpectColumnValuesToNotBeNull(column="sample_id"),
        gx.expectations.ExpectColumnValuesToBeUnique(column="sample_id"),
        gx.expectations.ExpectColumnValuesToBeBetween(column="label", min_value=0,
                                                      max_value=manifest["num_classes"] - 1),
        gx.expectations.ExpectColumnValuesToBeInSet(column="finite", value_set=[True]),
    ]) + validate_frame(counts, "counts", [
        gx.expectations.ExpectColumnPairValuesToBeEqual(column_A="rows", column_B="manifest_count"),
        gx.expectations.ExpectColumnValuesToBeInSet(column="aligned", value_set=[True]),
    ])
    if failures:
        raise ValidationFailed(f"partition {scenario!r} failed {len(failures)} expectation(s):\n"
                               + "\n".join(f"  - {f}" for f in failures))
    return {"scenario": scenario, "samples": len(rows), "splits": len(counts), "expectations": 6}
