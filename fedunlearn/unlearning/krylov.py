"""Hessian-free second-order building blocks: the training objective as a function of one flat
parameter vector, its gradient, Hessian-vector products by double backprop, and conjugate
gradient (Hestenes–Stiefel; the form of HF-KCU's Algorithm 1, lines 6–13, and of Martens'
Hessian-free optimisation) on flat vectors.

Everything stays on the parameters' device and dtype. The CG loop never reads a number back to
the host (no ``.item()``, ``float()`` or ``.cpu()``): its step sizes and residual norms are
collected in device tensors, so a GPU runs the k iterations without synchronising; callers
convert the record once, at the end.

Hessian-vector products (Pearlmutter 1994): the objective is made a function of a flat vector
with ``torch.func.functional_call``; its gradient is taken once with ``create_graph=True`` and
each product ``H v = ∇(∇L·v)`` is then one more backward pass through that graph (``v`` enters
as the backward pass's ``grad_outputs``, which is ``Hᵀv = Hv`` since H is symmetric). Reusing the
gradient graph across the k CG iterations saves the forward and first backward pass that
``torch.func.jvp(grad(f))`` would redo for every product.

Extreme eigenvalues (``ritz_values``, ``lanczos``). CG is Lanczos in disguise: its coefficients
give the Lanczos tridiagonal matrix T_k of the Krylov space of b for free. But CG builds T_k by an
LDLᵀ factorisation whose pivots are 1/α_t, so by Sylvester's law of inertia T_k has exactly as
many negative eigenvalues as CG has negative step sizes: CG's own Ritz values can never reveal
more than the signs of its α_t do, and a right-hand side with little weight on the negative
eigenvectors leaves them unseen (an MLP whose damped Hessian is indefinite gave only positive
α_t: docs/methods.md, "hf-kcu"). ``lanczos`` runs a separate Lanczos process from a random start
vector, which has weight on every eigenvector; its extreme Ritz values converge to both ends of
the spectrum first (Kaniel–Paige–Saad), at least as fast as power iteration, whose iterates lie
in the same Krylov space. Every Ritz value is a Rayleigh quotient, so min Ritz ≥ λ_min: a
negative one PROVES the matrix indefinite, a positive one is an estimate that can still miss a
negative eigenvalue. Like CG's, the Lanczos loop stays on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedunlearn.federation.local import State, objective

Vector = torch.Tensor
Operator = Callable[[Vector], Vector]


class _Objective(nn.Module):
    """``objective(model, x, y)`` as a module's forward pass, so that ``functional_call`` swaps
    the parameters for the regulariser as well as for the logits."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return objective(self.model, x, y)


def flatten_parameters(model: nn.Module) -> Vector:
    """The model's parameters as one detached vector (``named_parameters`` order)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def add_to_parameters(state: State, model: nn.Module, step: Vector) -> State:
    """``state`` with ``step`` (a flat vector in ``flatten_parameters`` order) added to its
    parameters; buffers are kept as they are."""
    new_state = dict(state)
    offset = 0
    for name, p in model.named_parameters():
        new_state[name] = state[name] + step[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return new_state


def flat_objective(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[Vector], torch.Tensor]:
    """θ ↦ objective(model with parameters θ, x, y): the mean cross-entropy plus the model's
    regulariser (``federation.local.objective``), evaluated in eval mode (no dropout noise in
    curvature estimates). Buffers are taken from ``model``."""
    wrapper = _Objective(model).eval()
    names = [f"model.{name}" for name, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    buffers = {f"model.{name}": b for name, b in model.named_buffers()}

    def fn(theta: Vector) -> torch.Tensor:
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(theta, sizes), shapes)}
        return functional_call(wrapper, {**params, **buffers}, (x, y))

    return fn


def gradient(fn: Callable[[Vector], torch.Tensor], theta: Vector) -> Vector:
    """∇fn(θ), detached."""
    theta = theta.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(theta), theta)
    return grad


def hvp_operator(fn: Callable[[Vector], torch.Tensor], theta: Vector, damping: float = 0.0) -> Operator:
    """v ↦ (∇²fn(θ) + damping·I) v by double backprop; the gradient graph is built here once and
    kept alive by the returned closure (memory: one forward + backward graph of ``fn``)."""
    theta = theta.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(theta), theta, create_graph=True)

    def apply(v: Vector) -> Vector:
        (hv,) = torch.autograd.grad(grad, theta, grad_outputs=v, retain_graph=True)
        return hv + damping * v if damping else hv

    return apply


@dataclass
class CGResult:
    """``solution`` x_k; ``residual_norms`` ‖r_t‖ for t = 0..k (the recursively updated residual,
    r_0 = b); ``step_sizes`` α_t and ``directions`` β_t, the CG coefficients (they define the
    Lanczos tridiagonal matrix, see ``ritz_values``). All on the device of ``b``."""

    solution: Vector
    residual_norms: Vector
    step_sizes: Vector
    directions: Vector


def conjugate_gradient(matvec: Operator, b: Vector, iterations: int) -> CGResult:
    """k = ``iterations`` CG steps on A x = b from x_0 = 0 (A symmetric; positive definite for the
    usual guarantees). A fixed k, as in HF-KCU: stopping on a tolerance would need a host read of
    the residual every iteration. Once the residual is exactly zero (x solved, or b = 0) the
    iterates stay put: the divisions are guarded on the device instead of branching on the host."""
    if iterations < 1:
        raise ValueError(f"CG needs at least one iteration, got {iterations}")
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = r @ r
    zero = torch.zeros_like(rr)
    norms = b.new_empty(iterations + 1)
    step_sizes = b.new_empty(iterations)
    directions = b.new_empty(iterations)
    norms[0] = rr.sqrt()
    for t in range(iterations):
        q = matvec(p)
        pq = p @ q
        alpha = torch.where(pq != 0, rr / pq, zero)
        x = x + alpha * p
        r = r - alpha * q
        rr_next = r @ r
        beta = torch.where(rr != 0, rr_next / rr, zero)
        p = r + beta * p
        rr = rr_next
        norms[t + 1] = rr.sqrt()
        step_sizes[t] = alpha
        directions[t] = beta
    return CGResult(x, norms, step_sizes, directions)


def ritz_values(result: CGResult) -> np.ndarray:
    """Eigenvalue estimates of A from CG's own coefficients, at no extra products: CG is Lanczos
    in disguise, and its tridiagonal matrix T has diagonal 1/α_0, 1/α_t + β_{t−1}/α_{t−1} and
    off-diagonal √β_t/α_t (Saad, Iterative Methods, §6.7.3). Its eigenvalues (Ritz values) lie
    inside A's spectrum, so max/min is a lower bound on κ(A) that tightens as k grows (exact
    at k = dim A). Uses the iterations before CG stopped moving (α = 0). Reads the device
    tensors once."""
    alphas = result.step_sizes.detach().cpu().double().numpy()
    betas = result.directions.detach().cpu().double().numpy()
    k = int(np.argmax(alphas == 0)) if (alphas == 0).any() else len(alphas)
    if k == 0:
        return np.empty(0)
    alphas, betas = alphas[:k], betas[:k]
    diagonal = 1.0 / alphas
    diagonal[1:] += betas[:-1] / alphas[:-1]
    off = np.sqrt(betas[:-1]) / alphas[:-1]
    tridiagonal = np.diag(diagonal) + np.diag(off, 1) + np.diag(off, -1)
    return np.linalg.eigvalsh(tridiagonal)



@dataclass
class LanczosResult:
    """The Lanczos tridiagonal matrix: ``diagonal`` a_j and ``off_diagonal`` b_j (b_j couples steps
    j and j + 1; the last one is not part of the matrix). On the device of the start vector."""

    diagonal: Vector
    off_diagonal: Vector


def lanczos(matvec: Operator, start: Vector, steps: int) -> LanczosResult:
    """``steps`` Lanczos iterations (at most dim A) on the symmetric A from ``start``, with full
    reorthogonalisation: the basis is kept (``steps`` × dim floats of memory) and every new vector
    is orthogonalised against all of it twice (classical Gram–Schmidt loses orthogonality once;
    "twice is enough"), so converged Ritz values do not come back as ghost copies. Like
    ``conjugate_gradient``, no host reads: an exact breakdown (an invariant subspace found) leaves
    b_j = 0 and the following vectors zero, and ``lanczos_ritz_values`` cuts the matrix there."""
    if steps < 1:
        raise ValueError(f"Lanczos needs at least one step, got {steps}")
    steps = min(steps, start.numel())
    basis = start.new_zeros(steps, start.numel())
    diagonal = start.new_empty(steps)
    off_diagonal = start.new_empty(steps)
    q = start / start.norm()
    for j in range(steps):
        basis[j] = q
        w = matvec(q)
        diagonal[j] = q @ w
        for _ in range(2):
            w = w - basis[:j + 1].T @ (basis[:j + 1] @ w)
        beta = w.norm()
        off_diagonal[j] = beta
        q = torch.where(beta > 0, w / beta, torch.zeros_like(w))
    return LanczosResult(diagonal, off_diagonal)


def lanczos_ritz_values(result: LanczosResult) -> np.ndarray:
    """Eigenvalues of the Lanczos matrix up to the first breakdown: Rayleigh quotients of A, so
    inside its spectrum (min ≥ λ_min, max ≤ λ_max). Reads the device tensors once."""
    diagonal = result.diagonal.detach().cpu().double().numpy()
    off = result.off_diagonal.detach().cpu().double().numpy()[:-1]
    size = int(np.argmax(off == 0)) + 1 if (off == 0).any() else len(diagonal)
    tridiagonal = np.diag(diagonal[:size]) + np.diag(off[:size - 1], 1) + np.diag(off[:size - 1], -1)
    return np.linalg.eigvalsh(tridiagonal)
