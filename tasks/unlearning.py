"""Prefect tasks of unlearning, shared by the benchmark and the deletion pipeline."""

from __future__ import annotations

import inspect
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from fedunlearn.benchmark import runner
from fedunlearn.certify.certificate import Certificate
from fedunlearn.faults import failpoint
from fedunlearn.unlearning import get_method
from fedunlearn.unlearning.base import Outcome, UnlearningMethod
from fedunlearn.unlearning.registry import get_method_class
from tasks.timing import core_compute

GPU_TAG = "gpu"


def build_method(name: str, setting: str, kind: str, target_test_acc: float | None,
                 options: dict[str, Any]) -> UnlearningMethod:
    """Methods that recover "until test accuracy reaches the retrained model's" (PUF) are told
    ``target_test_acc``; everything else comes from ``options``."""
    accepted = inspect.signature(get_method_class(name, setting)).parameters
    hyperparameters = dict(options)
    if "target_test_acc" in accepted and target_test_acc is not None:
        hyperparameters.setdefault("target_test_acc", target_test_acc)
    return get_method(name, setting=setting, kind=kind, **hyperparameters)


@task(name="unlearn", cache_policy=NO_CACHE, tags=[GPU_TAG], task_run_name="unlearn-{name}")
@core_compute
def unlearn(setup: runner.BenchmarkSetup, original: dict, name: str, target_test_acc: float | None,
            options: dict[str, Any], timings: int = 1) -> tuple[Outcome, Certificate]:
    """``timings``: see ``runner.run_method`` (the benchmark times short runs several times)."""
    method = build_method(name, setup.fed_state.setting, setup.batch.kind, target_test_acc, options)
    outcome = runner.run_method(setup, original, method, timings)
    failpoint("during-unlearning")
    return outcome, runner.method_certificate(setup, method, outcome)
