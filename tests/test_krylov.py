"""Krylov building blocks: CG against direct solves (a small SPD system, an explicit Hessian), the
Ritz-value condition estimate, Lanczos from a random start finding the negative curvature CG's
own Ritz values cannot show, double-backprop Hessian-vector products, and no host reads."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedunlearn.unlearning.krylov import (add_to_parameters, conjugate_gradient, flat_objective, flatten_parameters,
                                          gradient, hvp_operator, lanczos, lanczos_ritz_values, ritz_values)
from models.logreg import LogisticRegression
from models.mlp import MLP

F64 = torch.float64


def spd_system(dim: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    m = torch.randn(dim, dim, generator=generator, dtype=F64)
    return m @ m.T + 0.5 * torch.eye(dim, dtype=F64), torch.randn(dim, generator=generator, dtype=F64)


def test_cg_solves_a_small_spd_system_and_estimates_its_spectrum():
    a, b = spd_system()
    result = conjugate_gradient(lambda v: a @ v, b, iterations=8)  # CG terminates in dim steps

    torch.testing.assert_close(result.solution, torch.linalg.solve(a, b), rtol=1e-9, atol=1e-9)
    assert result.residual_norms.shape == (9,)
    assert result.residual_norms[0] == pytest.approx(float(b.norm()))
    assert result.residual_norms[-1] < 1e-9 * result.residual_norms[0]
    # CG's coefficients are Lanczos': after dim steps the Ritz values are A's eigenvalues.
    assert ritz_values(result) == pytest.approx(torch.linalg.eigvalsh(a).numpy(), rel=1e-8)
    # Fewer steps: Ritz values inside the spectrum, so max/min under-estimates κ.
    few = ritz_values(conjugate_gradient(lambda v: a @ v, b, iterations=3))
    eig = torch.linalg.eigvalsh(a)
    assert eig[0] <= few.min() and few.max() <= eig[-1] * (1 + 1e-12)


def test_lanczos_finds_the_negative_curvature_cg_never_meets():
    """A = Q diag(−0.5, 0.1, …, 40) Qᵀ and b orthogonal to the negative eigenvector: CG sees an SPD
    problem (every α_t > 0, every Ritz value > 0: T_k = LDLᵀ with pivots 1/α_t has their signs),
    Lanczos from a random start finds λ_min."""
    generator = torch.Generator().manual_seed(2)
    q, _ = torch.linalg.qr(torch.randn(40, 40, generator=generator, dtype=F64))
    eigenvalues = torch.cat([torch.tensor([-0.5], dtype=F64), torch.linspace(0.1, 40, 39, dtype=F64)])
    a = q @ torch.diag(eigenvalues) @ q.T
    b = q[:, 1:] @ torch.randn(39, generator=generator, dtype=F64)
    cg = conjugate_gradient(lambda v: a @ v, b, iterations=10)
    assert (cg.step_sizes > 0).all() and ritz_values(cg).min() > 0

    start = torch.randn(40, generator=generator, dtype=F64)
    few = lanczos_ritz_values(lanczos(lambda v: a @ v, start, steps=15))
    assert -0.5 - 1e-12 <= few.min() < 0 and few.max() <= 40 + 1e-9  # inside the spectrum
    # dim steps: the whole spectrum, reorthogonalised (no ghost copies); more steps are capped at dim.
    assert lanczos_ritz_values(lanczos(lambda v: a @ v, start, steps=60)) == pytest.approx(eigenvalues.numpy(),
                                                                                          abs=1e-9)
    # An exact breakdown (the start spans an invariant subspace) stops the matrix there.
    diagonal = torch.diag(eigenvalues)
    assert lanczos_ritz_values(lanczos(lambda v: diagonal @ v, torch.eye(40, dtype=F64)[0], steps=5)).tolist() == [-0.5]
    with pytest.raises(ValueError, match="at least one step"):
        lanczos(lambda v: a @ v, start, steps=0)


def test_cg_with_a_zero_right_hand_side_stays_at_zero():
    a, _ = spd_system()
    result = conjugate_gradient(lambda v: a @ v, torch.zeros(8, dtype=F64), iterations=3)
    assert torch.equal(result.solution, torch.zeros(8, dtype=F64))
    assert torch.isfinite(result.residual_norms).all() and ritz_values(result).size == 0


def test_cg_never_reads_back_to_the_host():
    # Meta tensors have no data: any .item(), float(), .cpu() or data-dependent branch would raise.
    a, b = torch.empty(16, 16, device="meta"), torch.empty(16, device="meta")
    result = conjugate_gradient(lambda v: a @ v, b, iterations=5)
    assert result.solution.device.type == "meta" and result.residual_norms.shape == (6,)
    spectrum = lanczos(lambda v: a @ v, b, steps=5)
    assert spectrum.diagonal.device.type == "meta" and spectrum.off_diagonal.shape == (5,)


def test_hvp_by_double_backprop_equals_the_explicit_hessian_of_a_network():
    torch.manual_seed(0)
    model = MLP((4,), 3, hidden=5).double()
    x, y = torch.randn(12, 4, dtype=F64), torch.randint(0, 3, (12,))
    theta = flatten_parameters(model)
    names, shapes = [n for n, _ in model.named_parameters()], [p.shape for p in model.parameters()]

    def explicit(flat):  # written out independently of flat_objective
        params = dict(zip(names, (t.view(s) for t, s in zip(flat.split([math.prod(s) for s in shapes]), shapes))))
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    hessian = torch.autograd.functional.hessian(explicit, theta)
    v = torch.randn_like(theta)
    operator = hvp_operator(flat_objective(model, x, y), theta, damping=0.3)
    torch.testing.assert_close(operator(v), hessian @ v + 0.3 * v)
    torch.testing.assert_close(operator(2 * v), 2 * (hessian @ v + 0.3 * v))  # the graph is reused
    torch.testing.assert_close(gradient(flat_objective(model, x, y), theta),
                               torch.autograd.functional.jacobian(explicit, theta))


def test_cg_on_hessian_vector_products_matches_a_direct_solve_with_the_l2_term():
    torch.manual_seed(1)
    l2, damping = 0.05, 0.01
    model = LogisticRegression((3,), 2, l2=l2).double()
    x, y = torch.randn(20, 3, dtype=F64), torch.randint(0, 2, (20,))
    theta = flatten_parameters(model)

    def explicit(flat):  # mean CE + (l2/2)‖θ‖², the logistic regression written out
        w, b = flat[:6].view(2, 3), flat[6:]
        return F.cross_entropy(x @ w.T + b, y) + 0.5 * l2 * flat.pow(2).sum()

    hessian = torch.autograd.functional.hessian(explicit, theta) + damping * torch.eye(8, dtype=F64)
    rhs = torch.randn(8, dtype=F64)
    result = conjugate_gradient(hvp_operator(flat_objective(model, x, y), theta, damping), rhs, iterations=8)
    torch.testing.assert_close(result.solution, torch.linalg.solve(hessian, rhs), rtol=1e-7, atol=1e-9)
    ritz = ritz_values(result)
    assert ritz.max() / ritz.min() == pytest.approx(float(torch.linalg.cond(hessian)), rel=1e-6)


def test_add_to_parameters_follows_the_flat_order_and_keeps_the_original():
    model = LogisticRegression((3,), 2).double()
    state = model.state_dict()
    step = torch.arange(8, dtype=F64)
    moved = add_to_parameters(state, model, step)
    torch.testing.assert_close(flatten_parameters(model) + step,
                               torch.cat([moved["linear.weight"].reshape(-1), moved["linear.bias"]]))
    assert not torch.equal(moved["linear.bias"], state["linear.bias"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cg_on_cuda_matches_the_cpu():
    a, b = spd_system()
    on_gpu = conjugate_gradient(lambda v: a.cuda() @ v, b.cuda(), iterations=8)
    assert on_gpu.solution.is_cuda and on_gpu.residual_norms.is_cuda
    torch.testing.assert_close(on_gpu.solution.cpu(), torch.linalg.solve(a, b), rtol=1e-9, atol=1e-9)
