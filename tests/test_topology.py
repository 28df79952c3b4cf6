"""DFL communication graphs: Metropolis mixing (symmetric, doubly stochastic, ρ < 1 exactly when
connected), Erdős–Rényi redrawn until connected, flooding that reaches every node exactly once,
and the scenario's topology parameters."""

import numpy as np
import pytest

from fedunlearn.config import ScenarioConfig, TopologyConfig
from fedunlearn.federation.topology import (Topology, build_topology, check_mixing, erdos_renyi, flood,
                                            metropolis_weights, ring, spectral_rho)


def graphs() -> list[Topology]:
    star = np.zeros((6, 6), dtype=bool)
    star[0, 1:] = star[1:, 0] = True
    line = np.eye(5, k=1, dtype=bool) | np.eye(5, k=-1, dtype=bool)
    return [ring(2), ring(3), ring(10), erdos_renyi(10, 0.3, seed=0), erdos_renyi(12, 0.5, seed=3),
            Topology("star", star), Topology("line", line)]


@pytest.mark.parametrize("topology", graphs(), ids=lambda t: f"{t.kind}-{len(t)}")
def test_metropolis_mixing_is_symmetric_doubly_stochastic_with_rho_below_one(topology):
    q = topology.mixing()
    assert np.allclose(q, q.T)
    assert np.allclose(q.sum(axis=0), 1) and np.allclose(q.sum(axis=1), 1)
    assert (q >= 0).all() and (q.diagonal() > 0).all()
    assert (q[~topology.adjacency & ~np.eye(len(q), dtype=bool)] == 0).all()  # only neighbours mix
    rho = topology.rho()
    assert 0 <= rho < 1
    # The paper's Lemma 1: ‖Q^k − 11ᵀ/N‖² ≤ ρ^k.
    k = 7
    gap = np.linalg.norm(np.linalg.matrix_power(q, k) - np.full_like(q, 1 / len(q)), ord=2) ** 2
    assert gap <= rho ** k + 1e-12


def test_metropolis_weights_of_a_ring():
    q = metropolis_weights(ring(5).adjacency)
    assert np.allclose(q[0], [1 / 3, 1 / 3, 0, 0, 1 / 3])
    assert spectral_rho(q) == pytest.approx(((1 + 2 * np.cos(2 * np.pi / 5)) / 3) ** 2)


def test_a_disconnected_graph_is_a_clear_error():
    two_pairs = Topology("pairs", np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=bool))
    assert not two_pairs.is_connected() and two_pairs.components() == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match=r"ρ = .* is not < 1.*disconnected, components \[\[0, 1\], \[2, 3\]\]"):
        two_pairs.mixing()
    with pytest.raises(ValueError, match="not doubly stochastic"):
        check_mixing(np.array([[0.5, 0.5], [0.5, 0.4]]))
    with pytest.raises(ValueError, match="not symmetric"):
        check_mixing(np.array([[0.5, 0.5], [0.4, 0.6]]))


def test_erdos_renyi_is_seeded_connected_and_refuses_hopeless_p():
    first, again, other = erdos_renyi(10, 0.3, seed=0), erdos_renyi(10, 0.3, seed=0), erdos_renyi(10, 0.3, seed=1)
    assert np.array_equal(first.adjacency, again.adjacency)
    assert not np.array_equal(first.adjacency, other.adjacency)
    assert first.is_connected() and (first.kind, first.p, first.seed) == ("er", 0.3, 0)
    with pytest.raises(ValueError, match="no connected Erdős–Rényi graph G\\(30, 0.01\\) in 5 draws"):
        erdos_renyi(30, 0.01, seed=0, max_tries=5)


@pytest.mark.parametrize("topology", graphs(), ids=lambda t: f"{t.kind}-{len(t)}")
def test_flooding_reaches_every_node_exactly_once(topology):
    for source in range(len(topology)):
        result = flood(topology.adjacency, source)
        assert result.reached_all and (result.first_receipts == 1).all()
        # Each node forwards once to all neighbours but the sender: 2|E| − (N − 1) copies in all,
        # every one of them received by someone (the duplicates are dropped).
        assert result.messages == 2 * topology.num_edges - (len(topology) - 1)
        assert result.receipts.sum() == result.messages


def test_flooding_a_ring_meets_itself_opposite_the_source():
    # 0 sends both ways; the two waves cross between 3 and 4, which each drop one duplicate.
    result = ring(6).flood(0)
    assert result.messages == 7
    assert result.receipts.tolist() == [0, 1, 1, 2, 2, 1]


def test_induced_subgraph_after_a_node_leaves():
    path = ring(6).induced([0, 1, 2, 4, 5])  # node 3 left: a path 4-5-0-1-2
    assert path.nodes == (0, 1, 2, 4, 5) and path.is_connected() and path.num_edges == 4
    assert path.flood(4).reached_all
    star = Topology("star", np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=bool))
    with pytest.raises(ValueError, match=r"disconnected, components \[\[1\], \[2\]\]"):
        star.induced([1, 2]).mixing()
    with pytest.raises(ValueError, match="not in this topology"):
        star.induced([7])


def test_scenario_topology_parameters():
    assert build_topology(TopologyConfig(), 4, seed=0).kind == "ring"
    er = build_topology(TopologyConfig(kind="er", p=0.5), 8, seed=5)
    assert er.seed == 5 and np.array_equal(er.adjacency, erdos_renyi(8, 0.5, seed=5).adjacency)
    assert build_topology(TopologyConfig(kind="er", p=0.5, seed=2), 8, seed=5).seed == 2
    assert ScenarioConfig(dataset="digits", setting="dfl").topology == TopologyConfig()
    with pytest.raises(ValueError, match="a topology applies to DFL scenarios only"):
        ScenarioConfig(dataset="digits", setting="hfl", topology={"kind": "ring"})
    with pytest.raises(ValueError, match="feature transforms .* apply to HFL/DFL partitions only"):
        ScenarioConfig(dataset="wine", setting="vfl", partition={"scheme": "vertical", "unit_norm": True})
