"""The Flower app (fedunlearn_flower, issue 38): a 3-client local deployment on 127.0.0.1 gives the
in-process engine's FedAvg model and PUF step, and leaves no Flower process behind; the records
carry states bit for bit; the package keeps the code's shape. The simulation engine, HF-KCU and
the faults (a SuperNode killed mid-round, one that never connects, an existing SuperLink) are in
tests/reliability/test_flower_engines.py (``make reliability``: each starts a federation)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from flower_helpers import SCENARIO, in_process, max_difference, prepared_workspace, sample_batch, \
    unlearned_in_process

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return prepared_workspace(tmp_path_factory.mktemp("flower") / "workspace")


def test_records_carry_a_state_bit_for_bit():
    from fedunlearn_flower.records import record_state, record_vector, state_record, vector_record

    state = {"w": torch.randn(3, 2), "steps": torch.tensor(7), "b": torch.randn(4, dtype=torch.float64)}
    back = record_state(state_record(state))
    assert list(back) == list(state)
    assert all(back[k].dtype == state[k].dtype and torch.equal(back[k], state[k]) for k in state)
    vector = torch.randn(11)
    assert torch.equal(record_vector(vector_record(vector)), vector)


def test_the_flower_package_keeps_the_code_shape():
    from test_code_shape import long_functions

    files = sorted((ROOT / "fedunlearn_flower").rglob("*.py"))
    assert len(files) >= 10
    assert [f for path in files for f in long_functions(path)] == []


@pytest.mark.reliability  # slow end to end: `make reliability`
def test_local_deployment_gives_the_in_process_fedavg_model_and_puf_step(workspace, tmp_path):
    """One FedAvg round, then PUF-Special's unlearning round, on a SuperLink and three SuperNode
    processes: the same model as the in-process engine (one intra-op thread on both sides, the same
    seeds, the same summation order: equal to float rounding), and the same PUF step to 1e-5."""
    from fedunlearn_flower.deployment import run_deployed
    from fedunlearn_flower.server_app import Job

    batch = sample_batch(workspace)
    job = Job(root=str(workspace), scenario=SCENARIO, out_dir=str(tmp_path / "run"), rounds=1, method="puf-special",
              batch=batch.to_dict(), step_only=True, connect_timeout=60, round_timeout=120)
    deployment_processes: list = []
    result = run_deployed(job, timeout=240, on_start=deployment_processes.append)

    reference = in_process(workspace, rounds=1)
    assert max_difference(result.trained, reference.state) <= 1e-6
    step = unlearned_in_process(reference, batch, "puf-special", max_recovery_rounds=0)
    assert max_difference(result.step, step) <= 1e-5
    assert max_difference(result.step, result.trained) > 1e-3  # the step moved the model
    assert sorted(result.notes["nodes"]) == ["0", "1", "2"]
    _rounds_are_recorded_as_in_process(workspace, tmp_path / "run", result)
    [deployment] = deployment_processes
    assert deployment.alive() == []  # no SuperLink, SuperNode, SuperExec, ServerApp or ClientApp left


def _rounds_are_recorded_as_in_process(workspace: Path, out: Path, result) -> None:
    """The round the ServerApp recorded (its model, training loss, participants and samples) gives the
    in-process trainer's per-round loss and PUF Appendix B cost (FLOPs, bytes) for the same round."""
    from fedunlearn.unlearning.base import fedavg_rounds
    from fedunlearn_flower.engine import training_cost
    from fedunlearn_flower.partition import Scenario
    from fedunlearn_flower.server_app import ROUND

    losses: list[float] = []

    class Monitor:
        def record(self, phase, round_idx, state, train_loss=float("nan")) -> None:
            losses.append(train_loss)

    reference = in_process(workspace, rounds=1)
    _, cost = fedavg_rounds(reference, reference.clients, state=None, rounds=1, first_round=0, phase="train",
                            monitor=Monitor())
    [record] = result.notes["rounds"]
    assert record["round"] == 1 and record["clients"] == 3
    assert record["train_loss"] == pytest.approx(losses[0], rel=1e-6)
    round_state = torch.load(out / ROUND.format(1), weights_only=True)
    assert max_difference(round_state, result.trained) == 0.0
    flower_cost = training_cost(Scenario.load(workspace, SCENARIO), result.notes["rounds"], result.trained, 1.0)
    assert (flower_cost.flops, flower_cost.comm_bytes) == (cost.flops, cost.comm_bytes) and cost.flops > 0


def test_the_fault_hook_is_inert_unless_it_names_a_supernode():
    """``FEDUNLEARN_FLOWER_FAULT`` (the reliability tests' SuperNode kill) is off unless set, and a
    value it cannot read is refused rather than ignored: a fault test must not pass by injecting nothing."""
    from fedunlearn_flower.deployment import fault_target
    from fedunlearn_flower.errors import FlowerRunFailed

    assert fault_target(None) is None and fault_target("") is None
    assert fault_target("kill-supernode:2") == 2
    for wrong in ("kill-supernode", "kill-supernode:two", "kill-superlink:1"):
        with pytest.raises(FlowerRunFailed, match="kill-supernode:<partition ID>"):
            fault_target(wrong)


def test_the_program_below_the_guard_is_found_and_its_kill_is_the_guards_status(tmp_path):
    """The deployment's processes run under the lifeline's guard: ``command_pid`` finds the program
    itself (a console script runs as `python <script>`), which the fault hook kills; the guard then
    exits as the program did, so a lost SuperNode still reads "exited with status -9"."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    from fedunlearn import lifeline
    from fedunlearn_flower.deployment import FlowerProcess

    script = tmp_path / "flower-supernode"  # a stand-in with a child of its own, as a SuperNode's ClientApp
    script.write_text(f"#!{sys.executable}\nimport subprocess, sys, time\n"
                      "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)\n")
    script.chmod(0o755)
    guard = subprocess.Popen(lifeline.guarded([str(script)]))
    node = FlowerProcess("SuperNode 0", "-", guard, tmp_path / "log", [str(script)])
    try:
        deadline = time.monotonic() + 20
        while node.command_pid() is None or not psutil.Process(node.command_pid()).children():
            assert time.monotonic() < deadline and guard.poll() is None
            time.sleep(0.05)
        program = node.command_pid()
        assert program != guard.pid and str(script) in psutil.Process(program).cmdline()
        os.kill(program, signal.SIGKILL)
        assert guard.wait(timeout=20) == -signal.SIGKILL and node.command_pid() is None
    finally:
        if guard.poll() is None:
            guard.kill()
