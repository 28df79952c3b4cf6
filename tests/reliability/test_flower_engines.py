"""The Flower app on both engines and under faults (issue 38). Each test starts a federation — Ray
for the simulation, a SuperLink and three SuperNode processes for the deployment — which costs tens
of seconds, so they run in ``make reliability`` only (``make test`` runs the 3-client deployment
equivalence of tests/test_flower.py).

* Simulation: FedAvg and PUF-Regular's unlearning round equal the in-process engine's; HF-KCU with
  the federation's Hessian, its products computed on the clients, equals the in-process step; so do
  gradient ascent, fine-tuning and FedQUIT (with ``remembered`` set); every socket Ray's processes
  listen on is on the loopback.
* A SuperNode killed mid-round ends the run with ``NodeLost`` naming it, and no process is left.
* A SuperNode that never connects ends it with ``NodeNeverConnected`` naming its address.
* An existing SuperLink given by address runs the job (the deployment's, here).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from flower_helpers import SCENARIO, in_process, max_difference, prepared_workspace, sample_batch, \
    unlearned_in_process
FULL = os.environ.get("RELIABILITY_FULL") == "1"

pytestmark = pytest.mark.skipif(not FULL, reason="starts Flower federations: make reliability")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return prepared_workspace(tmp_path_factory.mktemp("flower") / "workspace")


def job(workspace: Path, out: Path, **fields):
    from fedunlearn_flower.server_app import Job

    return Job(root=str(workspace), scenario=SCENARIO, out_dir=str(out),
               **{"connect_timeout": 60, "round_timeout": 120, **fields})


def test_simulation_gives_the_in_process_fedavg_model_and_puf_regular_step(workspace, tmp_path):
    from fedunlearn_flower.simulation import run_simulated

    batch = sample_batch(workspace)
    result = run_simulated(job(workspace, tmp_path / "run", rounds=2, method="puf-regular", batch=batch.to_dict(),
                               step_only=True))
    reference = in_process(workspace, rounds=2)
    assert max_difference(result.trained, reference.state) <= 1e-6
    step = unlearned_in_process(reference, batch, "puf-regular", max_recovery_rounds=0)
    assert max_difference(result.step, step) <= 1e-5
    assert _ray_processes_after(grace=10.0) == []  # Flower's Ray backend shut its local cluster down


def test_the_simulation_engine_listens_on_the_loopback_only(workspace, tmp_path):
    """Every socket Ray's and Flower's processes listen on during a simulated run (GCS, raylet,
    object manager, workers, agents, the autoscaler's metrics, this driver's own) is on a loopback
    address: the project's rule that servers bind 127.0.0.1 (``simulation.ray_on_loopback``)."""
    from fedunlearn_flower.simulation import run_simulated

    seen: set[tuple[str, str, int]] = set()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
                try:
                    seen.update((" ".join(proc.cmdline()[:2])[-60:], c.laddr.ip, c.laddr.port)
                                for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN)
                except psutil.Error:
                    continue
            time.sleep(0.2)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        run_simulated(job(workspace, tmp_path / "run", rounds=1))
    finally:
        done.set()
        watcher.join()
    assert len({port for _, _, port in seen}) >= 4, seen  # GCS, raylet, object manager, workers at least
    assert [entry for entry in sorted(seen) if not _loopback(entry[1])] == []


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def _ray_processes_after(grace: float) -> list[str]:
    """This process's descendants that are Ray's (raylet, GCS, workers), once ``grace`` has passed."""
    deadline = time.monotonic() + grace
    while True:
        left = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "ray" in " ".join(p.cmdline())]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.parametrize("hessian", ["federation", "client"])
def test_simulation_hf_kcu_with_client_side_hessian_vector_products(workspace, tmp_path, hessian):
    """A model trained in-process, unlearned through Flower by the engine function a pipeline
    task calls: the HF-KCU step of the core, its Hessian-vector products computed on the clients
    (``federation``: one ``query.hvp`` exchange per CG step; ``client``: one ``query.krylov``)."""
    from fedunlearn_flower.engine import unlearn_with_flower

    batch = sample_batch(workspace)
    params = {"cg_iterations": 3, "hessian_batch": 64, "hessian": hessian}
    reference = in_process(workspace, rounds=2)  # the scenario's rounds: the unlearning round's seeds follow them
    unlearned, notes, runtime = unlearn_with_flower(workspace, SCENARIO, tmp_path / "run", reference.state, "hf-kcu",
                                                    params, batch, runner="simulation")
    expected = unlearned_in_process(reference, batch, "hf-kcu", lanczos_steps=1, **params)
    assert max_difference(unlearned, expected) <= 1e-5
    assert max_difference(unlearned, reference.state) > 1e-6  # the step moved the model
    assert notes["hvp_exchanges"] == (3 if hessian == "federation" else 0) and runtime == "flower-simulation"


def test_simulation_runs_ga_finetune_and_fedquit_with_remembered_samples(workspace, tmp_path):
    """Issue 45, item 6, on the engine itself: each of the three methods, unlearned through Flower's
    simulation (ClientApps in Ray actors) from a model trained in-process, gives the in-process
    method's model; FedQUIT with ``remembered`` naming 4 of the 10 forget samples is the in-process
    FedQUIT with the same evidence (tests/test_flower_methods.py runs the same on a loopback grid)."""
    from fedunlearn.unlearning import get_method
    from fedunlearn_flower.engine import unlearn_with_flower

    batch = sample_batch(workspace)
    remembered = batch.with_remembered(batch.forget_ids[1][:4].tolist())
    reference = in_process(workspace, rounds=2)
    for method, params, deletion in (("ga", {"epochs": 2, "recovery_rounds": 1}, batch),
                                     ("finetune", {"rounds": 1}, batch),
                                     ("fedquit", {"rounds": 2, "recovery_rounds": 1}, remembered)):
        unlearned, notes, runtime = unlearn_with_flower(workspace, SCENARIO, tmp_path / method, reference.state,
                                                        method, params, deletion, runner="simulation")
        expected = get_method(method, setting="hfl", **params).unlearn(reference, deletion).state
        assert max_difference(unlearned, expected) <= 1e-5, method
        assert runtime == "flower-simulation" and notes["target_clients"] == [1]
    assert notes["quitting_samples"] == 4


def _kill_when_training(deployment, partition: int) -> None:
    """SIGKILL SuperNode ``partition`` once it runs its second ClientApp (the first is the
    partition query at connect): mid-way through the first training round."""
    from fedunlearn_flower.deployment import _descendants

    node = deployment.nodes[partition]

    def watch() -> None:
        seen: set[int] = set()
        while node.process.poll() is None:
            supernode = node.command_pid()  # the SuperNode itself, below the lifeline's guard
            if supernode is not None:
                seen.update(_descendants(supernode))
                if len(seen) >= 3:  # its SuperExec and two ClientApp processes
                    os.kill(supernode, signal.SIGKILL)
                    return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def test_a_supernode_killed_mid_round_is_named_and_nothing_is_left(workspace, tmp_path):
    from fedunlearn_flower.deployment import run_deployed
    from fedunlearn_flower.errors import NodeLost

    started: list = []

    def injure(deployment) -> None:
        started.append(deployment)
        _kill_when_training(deployment, 2)

    with pytest.raises(NodeLost, match=r"SuperNode 2 \(pid \d+, ClientAppIo 127\.0\.0\.1:\d+") as caught:
        run_deployed(job(workspace, tmp_path / "run", rounds=2), timeout=240, on_start=injure)
    assert "client 2 is gone" in str(caught.value)
    assert not (tmp_path / "run" / "trained.pt").exists()  # nothing produced from the broken round
    assert started[0].alive() == []


def test_a_supernode_that_never_connects_times_out_with_its_address(workspace, tmp_path):
    from fedunlearn_flower.deployment import HOST, free_port, run_deployed
    from fedunlearn_flower.errors import NodeNeverConnected

    nowhere = f"{HOST}:{free_port()}"  # nothing listens there: node 1 never reaches a SuperLink
    started: list = []
    with pytest.raises(NodeNeverConnected) as caught:
        run_deployed(job(workspace, tmp_path / "run", rounds=1, connect_timeout=10), timeout=120,
                     superlinks={1: nowhere}, on_start=started.append)
    message = str(caught.value)
    assert "client(s) 1 of digits-hfl never connected" in message
    assert f"SuperNode 1 (pid" in message and f"dials SuperLink {nowhere}" in message
    assert caught.value.clients == [1]
    assert started[0].alive() == []


def test_an_existing_superlink_given_by_address_runs_the_job(workspace, tmp_path):
    from fedunlearn_flower.deployment import LocalDeployment, run_deployed

    with LocalDeployment(3, tmp_path / "team-federation") as federation:  # "a team's own federation"
        result = run_deployed(job(workspace, tmp_path / "run", rounds=1), superlink=federation.control, timeout=240)
    assert max_difference(result.trained, in_process(workspace, rounds=1).state) <= 1e-6
    assert federation.alive() == []
