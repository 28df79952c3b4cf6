"""Prefect tasks of unlearning, shared by the benchmark and the deletion pipeline."""

from __future__ import annotations

import inspect
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency

from fedunlearn.benchmark import yardstick
from fedunlearn.certify.certificate import Certificate
from fedunlearn.faults import failpoint
from fedunlearn.federation.cost import Cost
from fedunlearn.requests.batch import BatchRecord
from fedunlearn.unlearning import get_method
from fedunlearn.unlearning.base import Outcome, UnlearningMethod
from fedunlearn.unlearning.registry import get_method_class
from fedunlearn.timing import core_compute
from fedunlearn_flower.engine import unlearn_with_flower
from fedunlearn_flower.server_app import ALGORITHMS
from stores.workspace import Workspace, checkout_from_cache

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
def unlearn(setup: yardstick.BenchmarkSetup, original: dict, name: str, target_test_acc: float | None,
            options: dict[str, Any], timings: int = 1) -> tuple[Outcome, Certificate]:
    """``timings``: see ``yardstick.run_method`` (the benchmark times short runs several times)."""
    method = build_method(name, setup.fed_state.setting, setup.forget_set.kind, target_test_acc, options)
    outcome = yardstick.run_method(setup, original, method, timings)
    failpoint("during-unlearning")
    return outcome, yardstick.method_certificate(setup, method, outcome)


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


def flower_methods() -> dict[str, set[str]]:
    """The methods the Flower app runs, each with the options its Flower version accepts."""
    return {name: cls.options() for name, cls in ALGORITHMS.items()}


@task(name="unlearn-through-flower", cache_policy=NO_CACHE, task_run_name="unlearn-{name}-through-flower")
def unlearn_through_flower(ws: Workspace, record: BatchRecord, setup: yardstick.BenchmarkSetup, original: dict,
                           name: str, target_test_acc: float | None, options: dict[str, Any],
                           engine: str) -> tuple[Outcome, Certificate]:
    """``unlearn``'s attempt computed by the Flower app on ``engine``: its clients read the data
    before the batch (the forget samples are gone from the workspace once the ledger moved), linked
    from DVC's cache into a workspace of the run's own. The outcome's notes carry ``runtime``; the
    certificate is the method's, as for ours. A Flower fault raises here, before registration."""
    params = dict(options)
    if target_test_acc is not None and "target_test_acc" in flower_methods()[name]:
        params.setdefault("target_test_acc", target_test_acc)
    with tempfile.TemporaryDirectory(prefix="fedunlearn-flower-", dir=ws.temporary_dir) as tmp:
        root = Path(tmp) / "workspace"
        checkout_from_cache(Path(ws.root), record.scenario, record.data_version_before, root)
        shutil.copyfile(Path(ws.root) / "params.yaml", root / "params.yaml")
        start = time.perf_counter()
        state, notes, runtime = unlearn_with_flower(root, record.scenario, Path(tmp) / "run", original, name,
                                                    params, setup.forget_set, runner=engine)
    outcome = Outcome(state, Cost(wall_seconds=time.perf_counter() - start, flops=float("nan")),
                      notes={**notes, "runtime": runtime})
    method = build_method(name, setup.fed_state.setting, setup.forget_set.kind, target_test_acc, options)
    return outcome, yardstick.method_certificate(setup, method, outcome)
