"""Prefect tasks of the benchmark flow: thin wrappers over ``fedunlearn.benchmark``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.benchmark import cache, yardstick
from fedunlearn.certify.certificate import Certificate
from fedunlearn.training import TrainedModel
from tasks.unlearning import GPU_TAG, build_method
from stores.workspace import Workspace


@task(name="train-original", cache_policy=NO_CACHE, tags=[GPU_TAG])
def train_or_reuse_original(ws: Workspace, setup: yardstick.BenchmarkSetup, data_version: str,
                            model: str) -> tuple[TrainedModel, bool]:
    """Returns the original model and whether it was reused from an earlier run."""
    key = cache.original_key(setup, data_version, model)
    cached = cache.load_original(ws.root, key, setup.fed_state.device)
    if cached is not None:
        return cached, True
    trained = yardstick.train_original(setup)
    cache.save_original(ws.root, key, trained, setup.scenario, data_version)
    return trained, False


@task(name="audit-ulira", cache_policy=NO_CACHE, tags=[GPU_TAG], task_run_name="ulira-{name}")
def audit_ulira(setup: yardstick.BenchmarkSetup, name: str, retrain_test_acc: float | None, options: dict[str, Any],
                num_pairs: int):
    return yardstick.ulira(setup, lambda: build_method(name, setup.fed_state.setting, "sample", retrain_test_acc,
                                                    options), num_pairs)


@task(name="write-report", cache_policy=NO_CACHE)
def write_report(out: Path, rows: list[dict], attacks: dict, histories: dict, header: dict,
                 certificates: dict[str, Certificate]) -> list[Path]:
    from fedunlearn.benchmark.report import write_report as write

    certificate_dir = out / "certificates"
    certificate_dir.mkdir(parents=True, exist_ok=True)
    for method, certificate in certificates.items():
        (certificate_dir / f"{method}.json").write_text(certificate.to_json() + "\n")
    return write(out, rows, attacks, histories, header) + sorted(certificate_dir.glob("*.json"))


@task(name="log-benchmark", cache_policy=NO_CACHE)
def log_benchmark(ws: Workspace, scenario: str, rows: list[dict], files: list[Path], header: dict) -> str:
    """One parent run with the report files; one child run per row, with the same metric keys on
    every row so MLflow's compare view lines them up."""
    experiment, registry = f"benchmark-{scenario}", ws.registry
    with registry.run(experiment, f"benchmark {header['request']}", dict(header),
                      {"role": "benchmark", "scenario": scenario}) as parent:
        for path in files:
            registry.log_artifact(parent, path, "certificates" if path.parent.name == "certificates" else None)
        for row in rows:
            with registry.run(experiment, row["method"],
                              {"method": row["method"], "scenario": scenario, "request": row["request"],
                               "notes": json.dumps(row.get("notes", {}), default=str)[:500]},
                              {"mlflow.parentRunId": parent, "method": row["method"],
                               "certificate": row["certificate"], "role": "benchmark-row"}) as child:
                registry.log_metrics(child, {k: v for k, v in row.items()
                                             if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return parent
