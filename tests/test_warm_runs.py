"""What a served deletion batch pays Prefect for, cut without changing what it records: flow runs
started from the warm process (``flows.warm``), served flows sent by reference, sub-flows beating
with their parent's heartbeat (``flows.heartbeat``), the GPU slot taken once per batch and only on a
GPU (``tasks.unlearning.gpu_slot``). The served end-to-end test runs batches through all of it."""

from __future__ import annotations

import pickle

import cloudpickle
import pytest
import torch
from prefect import flow
from prefect.settings import get_current_settings

from flows.heartbeat import parent_heartbeat

SEEN: dict[str, object] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One temporary Prefect server (own home and database) for this module's flows."""
    from prefect.settings import PREFECT_HOME, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp("prefect-home")
    with temporary_settings(updates={PREFECT_HOME: str(home)}):
        with prefect_test_harness(server_startup_timeout=120):
            yield home


@flow(name="heartbeat-child")
def heartbeat_child() -> None:
    SEEN["child"] = get_current_settings().flows.heartbeat_frequency


@flow(name="heartbeat-parent")
def heartbeat_parent() -> None:
    SEEN["parent"] = get_current_settings().flows.heartbeat_frequency
    with parent_heartbeat():
        heartbeat_child()
    SEEN["after"] = get_current_settings().flows.heartbeat_frequency


def test_sub_flows_beat_with_their_parents_heartbeat(server):
    heartbeat_parent()
    assert SEEN == {"parent": 180, "child": None, "after": 180}


def test_served_flows_travel_by_reference():
    from flows.process import process_deletions
    from flows.warm import send_flows_by_reference

    by_value = cloudpickle.dumps(process_deletions)
    send_flows_by_reference()
    by_reference = cloudpickle.dumps(process_deletions)
    assert pickle.loads(by_reference) is process_deletions
    assert len(by_reference) < 200 < len(by_value)  # module and name, not the function and its globals

    @flow(name="made-at-run-time")
    def local(x: int) -> int:
        return x + 1

    assert cloudpickle.loads(cloudpickle.dumps(local)).fn(1) == 2  # not a module attribute: by value, as before


class RecordingContext:
    """A multiprocessing context that records the process Prefect asks it for instead of starting one."""

    def __init__(self):
        self.started = []

    def Process(self, target, args):  # noqa: N802 — multiprocessing's name
        context = self

        class Recorded:
            def start(self):
                context.started.append((target, args))

        return Recorded()


def test_prefect_starts_served_flow_runs_from_the_context_warm_runs_install(monkeypatch):
    """The pinned Prefect's ``run_flow_in_subprocess`` takes its process from
    ``prefect.flow_engine.multiprocessing.get_context``: the one call ``flows.warm`` redirects to the
    forkserver. If a Prefect upgrade moves it, this fails (and served runs would start cold)."""
    from prefect import flow_engine

    from flows.process import process_deletions
    from flows.warm import _ForkServerProcesses

    recording = RecordingContext()
    monkeypatch.setattr(flow_engine, "multiprocessing", _ForkServerProcesses(recording))
    flow_engine.run_flow_in_subprocess(process_deletions, parameters={"scenario": "digits-hfl", "root": "."})
    [(target, _)] = recording.started
    assert target is flow_engine._run_serialized_call_with_control_bootstrap


def test_the_warm_start_leaves_one_thread_and_frozen_objects():
    """What each served run is forked from: the application imported, no thread to lose in the fork
    (an OpenMP pool started here would hang the runs' first parallel region), the heap frozen."""
    import subprocess
    import sys

    probe = ("import gc, threading, sys; import flows.warm_start; "
             "from prefect.client import orchestration; "
             "print(threading.active_count(), gc.get_freeze_count() > 100_000, "
             "'great_expectations' in sys.modules, 'dvc.repo' in sys.modules, "
             "type(orchestration.ssl).__name__, len(orchestration.ssl._verified))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    # Prefect's clients will share TLS contexts, none built yet: each forked run builds its own.
    assert out == ["1", "True", "True", "True", "_VerifiedContexts", "0"]


def test_prefect_clients_share_one_verified_tls_context(monkeypatch):
    import ssl

    from prefect.client import orchestration
    from prefect.client.orchestration import PrefectClient, SyncPrefectClient

    from flows.warm import PREFECT_TLS_MODULES, share_tls_contexts

    for name in PREFECT_TLS_MODULES:
        monkeypatch.setattr(f"{name}.ssl", ssl)  # undone after the test
    url = "http://127.0.0.1:9/api"
    assert PrefectClient(url)._client._transport._pool._ssl_context is not \
        PrefectClient(url)._client._transport._pool._ssl_context  # Prefect's own way: one per client
    share_tls_contexts()
    share_tls_contexts()  # idempotent: not wrapped twice
    contexts = {id(client._client._transport._pool._ssl_context)
                for client in (PrefectClient(url), PrefectClient(url), SyncPrefectClient(url))}
    assert len(contexts) == 1
    shared = orchestration.ssl.create_default_context(cafile=next(iter(orchestration.ssl._verified)))
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    unverified = orchestration.ssl.create_default_context()  # Prefect changes this one: never shared
    assert unverified is not orchestration.ssl.create_default_context() and id(unverified) not in contexts


def test_the_gpu_slot_is_held_once_and_only_on_a_gpu(server):
    from prefect.client.orchestration import get_client

    from tasks.unlearning import GPU_LIMIT, GPU_TAG, gpu_slot, unlearn, unlearn_in_gpu_slot

    assert unlearn.tags == {GPU_TAG} and unlearn_in_gpu_slot.tags == set()  # or it would wait for our own slot
    with gpu_slot(torch.device("cuda")):  # no limit set (no `make serve`): nothing to hold
        pass
    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=GPU_TAG, concurrency_limit=1)

        def held() -> int:
            return client.read_global_concurrency_limit_by_name(GPU_LIMIT).active_slots

        with gpu_slot(torch.device("cpu")):
            assert held() == 0
        with gpu_slot(torch.device("cuda")):  # a device object: no CUDA needed to ask for the slot
            assert held() == 1
        assert held() == 0
        client.delete_concurrency_limit_by_tag(GPU_TAG)


def test_the_thread_runner_runs_a_round_as_one_task_run(workspace, server):
    """On the default thread runner a round's client updates are one task run (they share the cores
    torch's threads already use); the model is the inline one (``test_train_flow``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.train import train_federated

    train_federated(scenario="digits-hfl", root=str(workspace), rounds=2)
    with get_client(sync_client=True) as client:
        [flow_run] = [r for r in client.read_flow_runs() if r.parameters.get("root") == str(workspace)]
        names = sorted(t.name for t in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))))
    assert [n for n in names if n.startswith("train-")] == ["train-clients-round-0", "train-clients-round-1"]
