"""Communication graphs for decentralized FL (DFL): who talks to whom, with what weights.

Certified decentralized unlearning (Wu, Tao, Zhou, Chen, Dressler and Yu, "Certified Unlearning
in Decentralized Federated Learning"; certified-decentralized-unlearning.txt §III-A, §IV-B)
trains with D-PSGD over a graph (V, E, Q) and spreads an unlearning update by flooding it.

* Graphs: a ring (each node linked to its two neighbours) and an Erdős–Rényi graph G(N, p)
  drawn from a seed; G(N, p) is redrawn (seeds derived from the given one) until it is
  connected, up to ``max_tries`` times, because a disconnected graph never reaches consensus.
* Mixing matrix: Metropolis(–Hastings) weights Q_ij = 1 / (1 + max(d_i, d_j)) on edges,
  Q_ii = 1 − Σ_{j≠i} Q_ij. Symmetric and doubly stochastic by construction, with a positive
  diagonal (so the graph's bipartiteness cannot make λ_N = −1).
* Spectral check (the paper's Assumption 1): ρ = max(|λ₂|, |λ_N|)² < 1 for the eigenvalues
  λ₁ = 1 ≥ λ₂ ≥ … ≥ λ_N of Q. It holds iff the graph is connected (given the positive
  diagonal); ``check_mixing`` names the disconnected components when it fails. By the paper's
  Lemma 1, ‖Q^k − 11ᵀ/N‖² ≤ ρ^k: the smaller ρ, the faster the local models agree.
* Flooding (Algorithm 1, lines 7–17): the source sends a message to its neighbours; a node
  that receives it for the first time applies it and forwards it to all its other neighbours;
  a node that receives it again drops it. ``flood`` simulates this message by message and
  counts receipts (duplicates included), first receipts and messages sent — the number the
  communication cost is charged for (2|E| − (N − 1) on a connected graph).

A node that leaves (client removal, or a node whose data are all deleted) leaves the graph:
``Topology.induced`` keeps the other nodes and their links, and the checks above apply to it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from fedunlearn.config import TopologyConfig

TOPOLOGY_KINDS = ("ring", "er")
_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Topology:
    """An undirected graph over nodes ``0..N−1`` (``adjacency``: symmetric boolean, no self
    loops). ``nodes`` are the labels of the nodes in a larger graph this one was induced from
    (client indices); by default ``0..N−1``."""

    kind: str
    adjacency: np.ndarray
    nodes: tuple[int, ...] = ()
    p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        a = np.asarray(self.adjacency, dtype=bool)
        if a.ndim != 2 or a.shape[0] != a.shape[1]:
            raise ValueError(f"adjacency must be a square matrix, got shape {a.shape}")
        if not np.array_equal(a, a.T) or a.diagonal().any():
            raise ValueError("adjacency must be symmetric without self loops")
        object.__setattr__(self, "adjacency", a)
        if not self.nodes:
            object.__setattr__(self, "nodes", tuple(range(len(a))))
        if len(self.nodes) != len(a):
            raise ValueError(f"{len(self.nodes)} node labels for {len(a)} nodes")

    def __len__(self) -> int:
        return len(self.adjacency)

    @property
    def num_edges(self) -> int:
        return int(self.adjacency.sum()) // 2

    @property
    def degrees(self) -> np.ndarray:
        return self.adjacency.sum(axis=1)

    def neighbours(self, i: int) -> list[int]:
        return np.flatnonzero(self.adjacency[i]).tolist()

    def is_connected(self) -> bool:
        return len(self.components()) == 1

    def components(self) -> list[list[int]]:
        """Connected components, as lists of node labels."""
        unseen = set(range(len(self)))
        found = []
        while unseen:
            reached = _reachable(self.adjacency, min(unseen))
            unseen -= reached
            found.append(sorted(self.nodes[i] for i in reached))
        return found

    def mixing(self) -> np.ndarray:
        """Metropolis weights, checked (symmetric, doubly stochastic, ρ < 1)."""
        q = metropolis_weights(self.adjacency)
        check_mixing(q, self)
        return q

    def rho(self) -> float:
        return spectral_rho(self.mixing())

    def induced(self, labels: Sequence[int]) -> "Topology":
        """The subgraph on the nodes with the given labels (the nodes that stay)."""
        index = {label: i for i, label in enumerate(self.nodes)}
        unknown = [label for label in labels if label not in index]
        if unknown:
            raise ValueError(f"node(s) {unknown} are not in this topology (nodes {list(self.nodes)})")
        keep = [index[label] for label in labels]
        return Topology(self.kind, self.adjacency[np.ix_(keep, keep)], tuple(int(v) for v in labels), self.p,
                        self.seed)

    def flood(self, source: int) -> "FloodResult":
        """Flood one message from the node labelled ``source`` (see ``flood``)."""
        return flood(self.adjacency, self.nodes.index(source))

    def describe(self) -> dict:
        """JSON-ready summary: kind, nodes, edges, ρ."""
        return {"kind": self.kind, "nodes": list(self.nodes), "edges": self.num_edges, "p": self.p,
                "seed": self.seed, "rho": self.rho()}


def ring(num_nodes: int) -> Topology:
    """Node i linked to i ± 1 (mod N). Two nodes share one link; one node has none."""
    _check_nodes(num_nodes)
    a = np.zeros((num_nodes, num_nodes), dtype=bool)
    for i in range(num_nodes):
        j = (i + 1) % num_nodes
        if j != i:
            a[i, j] = a[j, i] = True
    return Topology("ring", a)


def erdos_renyi(num_nodes: int, p: float, seed: int, *, max_tries: int = 100) -> Topology:
    """G(N, p) conditioned on connectivity: attempt t draws every link independently with
    probability p from the seed sequence (seed, t); the first connected draw is returned."""
    _check_nodes(num_nodes)
    if not 0 < p <= 1:
        raise ValueError(f"Erdős–Rényi edge probability p must be in (0, 1], got {p}")
    upper = np.triu_indices(num_nodes, k=1)
    for attempt in range(max_tries):
        a = np.zeros((num_nodes, num_nodes), dtype=bool)
        a[upper] = np.random.default_rng([seed, attempt]).random(len(upper[0])) < p
        a = a | a.T
        if len(_reachable(a, 0)) == num_nodes:
            return Topology("er", a, p=p, seed=seed)
    raise ValueError(f"no connected Erdős–Rényi graph G({num_nodes}, {p}) in {max_tries} draws from seed {seed}; "
                     "raise p (connectivity needs p ≳ ln(N)/N)")


def build_topology(config: "TopologyConfig", num_nodes: int, seed: int) -> Topology:
    """The topology a scenario's ``topology`` parameters describe; ``seed`` is used when the
    config gives none (the scenario's global seed)."""
    if config.kind == "ring":
        return ring(num_nodes)
    return erdos_renyi(num_nodes, config.p, seed if config.seed is None else config.seed)


def metropolis_weights(adjacency: np.ndarray) -> np.ndarray:
    """Q_ij = 1/(1 + max(d_i, d_j)) for linked i ≠ j, 0 for unlinked, Q_ii = 1 − Σ_{j≠i} Q_ij."""
    a = np.asarray(adjacency, dtype=bool)
    degrees = a.sum(axis=1)
    q = np.where(a, 1.0 / (1.0 + np.maximum.outer(degrees, degrees)), 0.0)
    np.fill_diagonal(q, 1.0 - q.sum(axis=1))
    return q


def spectral_rho(q: np.ndarray) -> float:
    """ρ = max(|λ₂|, |λ_N|)² of a symmetric Q (eigenvalues in decreasing order; λ₁ = 1)."""
    eigenvalues = np.sort(np.linalg.eigvalsh(q))[::-1]
    if len(eigenvalues) == 1:
        return 0.0
    return float(max(abs(eigenvalues[1]), abs(eigenvalues[-1])) ** 2)


def check_mixing(q: np.ndarray, topology: Topology | None = None) -> float:
    """Check the paper's requirements on Q and return ρ; a ValueError says which one fails.
    With ``topology``, a failing ρ names the disconnected components."""
    if not np.allclose(q, q.T, atol=_TOLERANCE):
        raise ValueError("mixing matrix is not symmetric")
    if (q < -_TOLERANCE).any():
        raise ValueError("mixing matrix has negative weights")
    if not (np.allclose(q.sum(axis=0), 1.0, atol=_TOLERANCE) and np.allclose(q.sum(axis=1), 1.0, atol=_TOLERANCE)):
        raise ValueError("mixing matrix is not doubly stochastic (rows and columns must sum to 1)")
    rho = spectral_rho(q)
    if rho >= 1.0 - _TOLERANCE:
        where = ""
        if topology is not None and not topology.is_connected():
            where = f": the graph is disconnected, components {topology.components()}"
        raise ValueError(f"ρ = max(|λ₂|, |λ_N|)² = {rho:.6f} is not < 1, so the local models never reach "
                         f"consensus{where}")
    return rho


@dataclass(frozen=True)
class FloodResult:
    """Per node: ``receipts`` (every copy that arrived, duplicates included) and
    ``first_receipts`` (copies applied: 1 for every node reached; the source counts its own
    message as applied). ``messages``: copies sent over links."""

    source: int
    receipts: np.ndarray
    first_receipts: np.ndarray
    messages: int

    @property
    def reached_all(self) -> bool:
        return bool((self.first_receipts == 1).all())


def flood(adjacency: np.ndarray, source: int) -> FloodResult:
    """Message-by-message simulation of Algorithm 1's flooding from node index ``source``: the
    source sends to every neighbour; a node forwards on its first receipt to every neighbour
    except the sender and drops later copies. Copies in flight are delivered in FIFO order
    (any order gives the same counts: each node forwards exactly once)."""
    a = np.asarray(adjacency, dtype=bool)
    n = len(a)
    receipts = np.zeros(n, dtype=np.int64)
    applied = np.zeros(n, dtype=np.int64)
    applied[source] = 1
    in_flight = deque((source, j) for j in np.flatnonzero(a[source]))
    messages = len(in_flight)
    while in_flight:
        sender, node = in_flight.popleft()
        receipts[node] += 1
        if applied[node]:
            continue  # a duplicate: dropped
        applied[node] = 1
        for j in np.flatnonzero(a[node]):
            if j != sender:
                in_flight.append((node, j))
                messages += 1
    return FloodResult(source, receipts, applied, messages)


def _reachable(adjacency: np.ndarray, start: int) -> set[int]:
    seen = {start}
    frontier = [start]
    while frontier:
        i = frontier.pop()
        for j in np.flatnonzero(adjacency[i]).tolist():
            if j not in seen:
                seen.add(j)
                frontier.append(j)
    return seen


def _check_nodes(num_nodes: int) -> None:
    if num_nodes < 1:
        raise ValueError(f"a topology needs at least one node, got {num_nodes}")
