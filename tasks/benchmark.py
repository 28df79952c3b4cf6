"""Prefect tasks of the benchmark flow: thin wrappers over ``fedunlearn.benchmark``."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.benchmark import cache, runner
from fedunlearn.certify.certificate import Certificate
from fedunlearn.faults import failpoint
from fedunlearn.unlearning import get_method
from fedunlearn.unlearning.registry import get_method_class
from tasks import tracking
from tasks.timing import core_compute

GPU_TAG = "gpu"


@task(name="train-original", cache_policy=NO_CACHE, tags=[GPU_TAG])
def train_or_reuse_original(root: Path, setup: runner.BenchmarkSetup, data_version: str,
                            model: str) -> tuple[runner.TrainedModel, bool]:
    """Returns the original model and whether it was reused from an earlier run."""
    key = cache.original_key(setup, data_version, model)
    cached = cache.load_original(root, key, setup.fed_state.device)
    if cached is not None:
        return cached, True
    trained = runner.train_original(setup)
    cache.save_original(root, key, trained)
    return trained, False


def build_method(name: str, setting: str, kind: str, retrain_test_acc: float | None, options: dict[str, Any]):
    """Methods that recover "until test accuracy reaches the retrained model's" (PUF) are told
    that accuracy; everything else comes from ``options``."""
    accepted = inspect.signature(get_method_class(name, setting)).parameters
    hyperparameters = dict(options)
    if "target_test_acc" in accepted and retrain_test_acc is not None:
        hyperparameters.setdefault("target_test_acc", retrain_test_acc)
    return get_method(name, setting=setting, kind=kind, **hyperparameters)


@task(name="unlearn", cache_policy=NO_CACHE, tags=[GPU_TAG], task_run_name="unlearn-{name}")
@core_compute
def unlearn(setup: runner.BenchmarkSetup, original: dict, name: str, retrain_test_acc: float | None,
            options: dict[str, Any], timings: int = 1):
    """``timings``: see ``runner.run_method`` (the benchmark times short runs several times)."""
    method = build_method(name, setup.fed_state.setting, setup.batch.kind, retrain_test_acc, options)
    outcome = runner.run_method(setup, original, method, timings)
    failpoint("during-unlearning")
    return outcome, runner.method_certificate(setup, method, outcome)


@task(name="audit-ulira", cache_policy=NO_CACHE, tags=[GPU_TAG], task_run_name="ulira-{name}")
def audit_ulira(setup: runner.BenchmarkSetup, name: str, retrain_test_acc: float | None, options: dict[str, Any],
                num_pairs: int):
    return runner.ulira(setup, lambda: build_method(name, setup.fed_state.setting, "sample", retrain_test_acc,
                                                    options), num_pairs)


@task(name="build-evaluator", cache_policy=NO_CACHE)
@core_compute
def build_evaluator(setup: runner.BenchmarkSetup) -> runner.Evaluator:
    return runner.Evaluator(setup)


@task(name="evaluate", cache_policy=NO_CACHE, task_run_name="evaluate-{name}")
@core_compute
def evaluate(evaluator: runner.Evaluator, name: str, model: torch.nn.Module, reference: torch.nn.Module | None):
    return evaluator.evaluate(model, reference)


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
def log_benchmark(root: Path, scenario: str, rows: list[dict], files: list[Path], header: dict) -> str:
    """One parent run with the report files; one child run per row, with the same metric keys on
    every row so MLflow's compare view lines them up."""
    experiment = f"benchmark-{scenario}"
    parent = tracking.start_run(root, experiment, f"benchmark {header['request']}",
                                {k: v for k, v in header.items()}, {"role": "benchmark", "scenario": scenario})
    client = tracking.use_store(root)
    for path in files:
        client.log_artifact(parent, str(path), artifact_path="certificates" if path.parent.name == "certificates"
                            else None)
    for row in rows:
        child = tracking.start_run(root, experiment, row["method"],
                                   {"method": row["method"], "scenario": scenario, "request": row["request"],
                                    "notes": json.dumps(row.get("notes", {}), default=str)[:500]},
                                   {"mlflow.parentRunId": parent, "method": row["method"],
                                    "certificate": row["certificate"], "role": "benchmark-row"})
        tracking.log_metrics(root, child, {k: v for k, v in row.items()
                                           if isinstance(v, (int, float)) and not isinstance(v, bool)})
        tracking.end_run(root, child)
    tracking.end_run(root, parent)
    return parent
