"""Cost formulas of the PUF paper's Appendix B, the FLOP counter convention, and cost records."""

import pytest
from torch import nn

from fedunlearn.federation.cost import (Cost, communication_bytes, flops_per_sample, speedup,
                                        training_flops)


def test_communication_is_two_transfers_per_participant_per_round():
    # 2·P·B·|S_t| summed over rounds: 2 · 1000 params · 4 bytes · 10 clients · 3 rounds
    assert communication_bytes(1000, 10, rounds=3) == 240_000
    assert communication_bytes(1000, [10, 5]) == 2 * 1000 * 4 * 15
    assert communication_bytes(1000, 10, bytes_per_param=2) == 40_000
    with pytest.raises(ValueError, match="not both"):
        communication_bytes(1000, [10, 5], rounds=2)


def test_training_flops_is_f_n_e_c_r():
    assert training_flops(100, num_samples=50, epochs=2, clients=3, rounds=4) == 100 * 50 * 2 * 3 * 4
    with pytest.raises(ValueError):
        training_flops(100, num_samples=-1, epochs=1)


def test_formulas_reproduce_the_papers_retrain_costs():
    # PUF Table III, CIFAR-100, ResNet-18 (11,227,812 parameters), E = 1: retraining = 200 rounds of
    # the 9 remaining clients of 10, 5,000 images each, F = 0.15 GFLOPs → 1.62e11 bytes, 1.35e15 FLOPs.
    assert communication_bytes(11_227_812, 9, rounds=200) == pytest.approx(1.62e11, rel=0.005)
    assert training_flops(0.15e9, num_samples=5000, epochs=1, clients=9, rounds=200) == pytest.approx(1.35e15)


def test_flops_per_sample_counts_a_multiply_add_as_two_and_training_as_three_forwards():
    linear = nn.Linear(10, 5)
    assert flops_per_sample(linear, (10,), include_backward=False) == 2 * 10 * 5
    assert flops_per_sample(linear, (10,)) == 3 * 2 * 10 * 5


def test_flops_per_sample_handles_batch_norm_and_restores_the_mode():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten())
    model.train()
    # conv: 2 FLOPs × 9 taps × 1 input channel × 2 output channels × 6×6 positions
    assert flops_per_sample(model, (1, 8, 8), include_backward=False) == 2 * 9 * 2 * 36
    assert model.training


def test_cost_records_add_up_and_compare_with_retraining():
    unlearning = Cost(wall_seconds=1.5, flops=1e9, comm_bytes=100)
    recovery = Cost(wall_seconds=0.5, flops=1e9, comm_bytes=300)
    total = unlearning + recovery
    assert total == Cost(2.0, 2e9, 400)
    retrain = Cost(wall_seconds=20.0, flops=4e10, comm_bytes=4000)
    assert total.speedups(retrain) == {"wall_seconds": 10.0, "flops": 20.0, "comm_bytes": 10.0}
    assert Cost(wall_seconds=1.0).speedups(retrain)["flops"] is None
    assert speedup(30.0, 3.0) == 10.0
    with pytest.raises(ValueError, match="positive"):
        speedup(30.0, 0.0)
