"""The Flower app (fedunlearn_flower, issue 38): a 3-client local deployment on 127.0.0.1 gives the
in-process engine's FedAvg model and PUF step, and leaves no Flower process behind; the records
carry states bit for bit; the package keeps the code's shape. The simulation engine, HF-KCU and
the faults (a SuperNode killed mid-round, one that never connects, an existing SuperLink) are in
tests/reliability/test_flower_engines.py (``make reliability``: each starts a federation)."""

from __future__ import annotations

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
    [deployment] = deployment_processes
    assert deployment.alive() == []  # no SuperLink, SuperNode, SuperExec, ServerApp or ClientApp left
