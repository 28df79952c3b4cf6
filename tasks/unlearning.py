"""Prefect tasks of unlearning, shared by the benchmark and the deletion pipeline."""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency

from fedunlearn.benchmark import runner
from fedunlearn.certify.certificate import Certificate
from fedunlearn.faults import failpoint
from fedunlearn.unlearning import get_method
from fedunlearn.unlearning.base import Outcome, UnlearningMethod
from fedunlearn.unlearning.registry import get_method_class
from fedunlearn.timing import core_compute

GPU_TAG = "gpu"
GPU_LIMIT = f"tag:{GPU_TAG}"  # the concurrency limit Prefect keeps for the tag (``make serve`` sets one slot)


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


# The same task for a caller that holds the GPU slot itself (``gpu_slot``): untagged, or it would wait for
# the slot its caller holds (``with_options(tags=set())`` keeps the tags: an empty set reads as "unchanged").
unlearn_in_gpu_slot = unlearn.with_options()
unlearn_in_gpu_slot.tags = set()


@contextmanager
def gpu_slot(device: torch.device) -> Iterator[None]:
    """On a GPU, hold one slot of the ``gpu`` tag's concurrency limit for the block (none set: nothing
    to hold); on the CPU there is no GPU to share. A deletion batch takes it once for its whole GPU
    phase — unlearning, evaluation, the retrain — rather than once per tagged task run: each
    acquisition and release is a request whose read-then-write transaction Prefect's sqlite server
    refuses while it persists events ('database is locked', 503), and the client backs off before it
    retries."""
    if device.type == "cpu" or not _gpu_limited():
        yield
        return
    with concurrency(GPU_LIMIT, occupy=1):
        yield


def _gpu_limited() -> bool:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(GPU_LIMIT)
        except ObjectNotFound:
            return False
    return True
