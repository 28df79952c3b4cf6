"""Prefect tasks that write what a batch did: the receipt (a file, an MLflow artifact of the
promoted version's run, Prefect artifacts of the flow run) and the registry's comparison table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from fedunlearn.benchmark.report import markdown_table
from fedunlearn.evaluation.forget_sets import header, on_forget_set
from fedunlearn.receipts import Receipt
from fedunlearn.receipts import write_receipt as write_receipt_file
from stores.workspace import Workspace
from tasks.forget_sets import latest_batch, measured_on

COMPARE_KEYS = ("version", "aliases", "role", "method", "data_version", "test_acc", "forget_acc", "mia_auc",
                "audit_auc", "certificate", "wall_seconds", "flops", "comm_bytes")


def _finite(value: float | None) -> float | None:
    return None if value is None or value != value else value


@task(name="write-receipt", cache_policy=NO_CACHE)
def write_receipt(ws: Workspace, receipt: Receipt) -> Path:
    """``data/receipts/<batch_id>.json`` and the same file on the promoted version's run."""
    path = write_receipt_file(ws.root, receipt)
    if receipt.models.get("unlearned") is not None:
        ws.registry.log_artifact(receipt.models["unlearned"].run_id, path, "receipt")
    return path


@task(name="publish-receipt", cache_policy=NO_CACHE)
def publish_receipt(receipt: Receipt) -> None:
    """Two Prefect artifacts of the batch's flow run: the receipt in markdown, the models as a table."""
    create_markdown_artifact(key="deletion-receipt", markdown=receipt.markdown(),
                             description=f"receipt of {receipt.batch_id}")
    table = [{"model": name, "version": ref.version, "role": ref.role, "data_version": ref.data_version,
              **{key: _finite(value) for key, value in receipt.metrics.get(name, {}).items()}}
             for name, ref in receipt.models.items() if ref is not None and name in receipt.metrics]
    create_table_artifact(key="deletion-batch-models", table=table,
                          description=f"models of {receipt.batch_id}")


def comparison(ws: Workspace, scenario: str, batch_id: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """Every registered version of ``scenario`` side by side (rows and the markdown table), its
    forget-set columns on one batch's forget set (``batch_id``, default the newest batch with a
    receipt; named in the line above the table), also logged as artifacts (``comparison.md``,
    ``comparison.json``) of a run in the experiment ``<scenario>-comparisons``, apart from the
    versions' own runs."""
    rows = ws.registry.table(scenario)
    latest = latest_batch(ws, scenario)
    batch_id = batch_id or (latest[0] if latest else None)
    title = ""
    if batch_id is not None:
        measured = measured_on(ws, scenario, batch_id)
        samples = latest[1] if latest and latest[0] == batch_id else _samples(measured)
        rows = [{**row, "forget_set": batch_id} for row in on_forget_set(rows, measured)]
        title = header(batch_id, samples, measured, len(rows)) + "\n\n"
    keys = COMPARE_KEYS + tuple(k for k in ("bd_asr", "erasure", "retired") if any(row.get(k) for row in rows))
    table = title + markdown_table(rows, keys)
    registry = ws.registry
    with registry.run(f"{scenario}-comparisons", f"compare {scenario}", {"versions": len(rows)},
                      {"role": "comparison", "scenario": scenario, **({"forget_set": batch_id} if batch_id else {})}
                      ) as run_id:
        registry.log_text(run_id, table, "comparison.md")
        registry.log_text(run_id, json.dumps(rows, indent=2, default=str), "comparison.json")
    return rows, table


def _samples(measured: dict[str, dict[str, Any]]) -> int | None:
    return next((found["samples"] for found in measured.values() if found.get("samples")), None)
