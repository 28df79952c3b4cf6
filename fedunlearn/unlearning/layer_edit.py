"""FedQUIT's quitting objective solved in closed form on the hidden layer below the output
(``FedQUIT(solver="edit")``; docs/methods.md, "fedquit").

A model that ends ``Linear (c → u) → ReLU → Linear (h → z)`` is linear in the hidden layer's
parameters up to that layer's output ``u``. The edit moves each remembered forget sample's logits
to the virtual teacher's ``t`` and holds the hidden layer's output on retained rows:

1. Through the output layer: the smallest change of ``h`` on the sample's active units (those with
   ``u > 0``, which pass a change on) that moves ``z`` to ``t``; that is the wanted change ``δu``.
2. The hidden layer's edit ``A`` (its weights and bias, stacked) then minimises the same squared
   distances FedQUIT's local steps descend with ``anchor="source"``, now at that layer:

       Σ_forget ‖[c, 1] A − δu‖² + μ · mean_retained ‖[c, 1] A‖² + ε ‖A‖²

   a ridge regression: the server factors the retained term once, each holder solves for its own
   few rows against that factor (the Woodbury identity).

The retained term is what keeps test accuracy: it is read from a bounded sample of every client's
retained rows, since a holder's own rows alone (a non-IID client's) leave the classes it lacks
unprotected. Each client sends the factor ``Q [c, 1]`` of its sample (``Q`` a random rotation the
client draws, so the factor's Gram is the sample's and its rows are not the sample's rows); the
server sends the retained term's Cholesky factor to each holder, which solves for its own remembered
samples and sends its edit; the server adds the edits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedunlearn.federation.local import Tensors


class EditUnsupported(ValueError):
    """The model does not end ``Linear → ReLU → Linear``: the edit does not apply (the steps do)."""


@dataclass(frozen=True)
class EditLayers:
    """The state-dict prefixes of the hidden layer the edit changes and of the output layer."""

    hidden: str
    output: str


@dataclass(frozen=True)
class Activations:
    """A forward pass's rows at the edited layers: the hidden layer's inputs ``c`` and outputs ``u``,
    the output layer's inputs ``h`` and the logits ``z``."""

    c: torch.Tensor
    u: torch.Tensor
    h: torch.Tensor
    z: torch.Tensor


@dataclass(frozen=True)
class HiddenEdit:
    """A holder's edit of the hidden layer (to add), the FLOPs of its solve and the rows it passed
    forward (the teacher's and the edited layers')."""

    weight: torch.Tensor
    bias: torch.Tensor
    solve_flops: float
    forward_rows: int = 0


def edit_layers(model: nn.Module) -> EditLayers:
    """The model's last two ``nn.Linear`` layers (hidden, output); refused where it has fewer."""
    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if len(linears) < 2:
        raise EditUnsupported(f"{type(model).__name__} has fewer than two nn.Linear layers")
    return EditLayers(linears[-2], linears[-1])


def activations(model: nn.Module, layers: EditLayers, x: torch.Tensor) -> Activations:
    """One forward pass without gradients, read at ``layers``; refused unless the output layer's input
    is the ReLU of the hidden layer's output and its output is the model's (the edit's premise)."""
    modules = dict(model.named_modules())
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [modules[name].register_forward_hook(
        lambda _m, inputs, output, key=name: seen.__setitem__(key, (inputs[0].detach(), output.detach())))
        for name in (layers.hidden, layers.output)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            z = model(x)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    (c, u), (h, out) = seen[layers.hidden], seen[layers.output]
    if c.dim() != 2 or not torch.equal(h, torch.relu(u)) or not torch.equal(out, z):
        raise EditUnsupported(f"{type(model).__name__} does not end Linear → ReLU → Linear")
    return Activations(c, u, h, z)


def with_bias(rows: torch.Tensor) -> torch.Tensor:
    """``[c, 1]`` in float64: the solve's scale follows the features', which training leaves uneven."""
    return torch.cat([rows.double(), torch.ones(len(rows), 1, dtype=torch.float64, device=rows.device)], dim=1)


def retained_factor(model: nn.Module, layers: EditLayers, rows: Tensors, generator: torch.Generator) -> torch.Tensor:
    """A client's share of the retained term: ``Q [c, 1]`` over its sampled rows, ``Q`` a random
    orthogonal matrix (the factor's Gram is the rows' Gram; the rows themselves stay)."""
    factor = with_bias(activations(model, layers, rows.x).c)
    gaussian = torch.randn(len(factor), len(factor), generator=generator, dtype=torch.float64)
    rotation = torch.linalg.qr(gaussian).Q.to(factor.device)
    return rotation @ factor


def wanted_change(acts: Activations, output_weight: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Per forget row, the smallest change of the hidden layer's output on its active units that moves
    the logits to ``teacher`` through the output layer (step 1 of the module docstring)."""
    weight = output_weight.double()
    change = torch.zeros_like(acts.u, dtype=torch.float64)
    residual = (teacher - acts.z).double()
    eye = torch.eye(weight.shape[0], dtype=torch.float64, device=weight.device)
    for row in range(len(residual)):
        active = (acts.u[row] > 0).double()
        through = weight * active                                  # the output layer seen from the active units
        change[row] = through.T @ torch.linalg.solve(through @ through.T + 1e-9 * eye, residual[row])
    return change


def retained_system(factors: torch.Tensor, *, retained_weight: float, ridge: float) -> tuple[torch.Tensor, float]:
    """The server's part of step 2: the Cholesky factor of ``μ · mean_retained [c, 1]ᵀ[c, 1] + εI`` from
    the stacked factors every client sent (one factorisation, shared by every holder), and its FLOPs."""
    rows, width = factors.shape
    gram = (retained_weight / max(rows, 1)) * (factors.T @ factors)
    gram += ridge * torch.eye(width, dtype=torch.float64, device=factors.device)
    return torch.linalg.cholesky(gram), 2.0 * rows * width * width + width ** 3 / 3.0


def solve_edit(forget_c: torch.Tensor, change: torch.Tensor, system: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``A = (G + FᵀF)⁻¹ Fᵀ δu`` (step 2; ``G = L Lᵀ`` the retained term, ``F`` the forget rows'
    ``[c, 1]``), by the Woodbury identity ``G⁻¹Fᵀ (I + F G⁻¹ Fᵀ)⁻¹ δu``: a holder's few rows cost
    solves against ``L``, not a factorisation of its own; and its FLOPs."""
    rows, width = forget_c.shape
    spread = torch.cholesky_solve(forget_c.T, system)                     # G⁻¹ Fᵀ
    inner = torch.eye(rows, dtype=torch.float64, device=forget_c.device) + forget_c @ spread
    edit = spread @ torch.linalg.solve(inner, change)
    flops = 4.0 * width * width * rows + 2.0 * rows * rows * width + (2.0 / 3.0) * rows ** 3 + \
        2.0 * width * rows * change.shape[1]
    return edit, flops


def hidden_edit(model: nn.Module, layers: EditLayers, forget: Tensors, teacher: torch.Tensor, system: torch.Tensor,
                *, only_predicted: bool = False) -> HiddenEdit:
    """A holder's edit for its remembered ``forget`` rows, ``teacher`` their target logits and
    ``system`` the server's ``retained_system``; with ``only_predicted``, for those of them ``model``
    still predicts with their label alone (a later pass: the first one's linearisation left them)."""
    acts = activations(model, layers, forget.x)
    keep = acts.z.argmax(dim=1) == forget.y.to(acts.z.device) if only_predicted else \
        torch.ones(len(forget), dtype=torch.bool, device=acts.z.device)
    modules = dict(model.named_modules())
    if not keep.any():
        hidden = modules[layers.hidden]
        return HiddenEdit(torch.zeros_like(hidden.weight), torch.zeros_like(hidden.bias), 0.0, len(forget))
    acts = Activations(acts.c[keep], acts.u[keep], acts.h[keep], acts.z[keep])
    output_weight = modules[layers.output].weight.detach()
    change = wanted_change(acts, output_weight, teacher[keep])
    edit, flops = solve_edit(with_bias(acts.c), change, system.to(acts.c.device))
    dtype = acts.c.dtype
    return HiddenEdit(edit[:-1].T.to(dtype).contiguous(), edit[-1].to(dtype).contiguous(), flops, len(forget))


def sample_rows(rows: Tensors, count: int, seed: int, client: int) -> tuple[Tensors, torch.Generator]:
    """A seeded sample of at most ``count`` of a client's retained rows, and the generator its
    rotation draws from."""
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, client, 0xED17]).generate_state(1)[0]))
    order = torch.randperm(len(rows), generator=generator)[:count]
    return rows.select(np.isin(np.arange(len(rows)), order.numpy())), generator
