"""FedQUIT's closed-form edit (fedunlearn/unlearning/layer_edit.py) on small random models: the wanted
change moves the logits exactly to the target through the active units alone; the Woodbury solve
equals the direct one and hits the forget rows' change where the retained term is weak; the retained
term keeps the edit off the retained rows; a client's factor keeps its rows' Gram, not its rows;
models that do not end Linear → ReLU → Linear are refused by name."""

import numpy as np
import pytest
import torch
from torch import nn

from fedunlearn.federation.local import Tensors
from fedunlearn.unlearning.layer_edit import (EditUnsupported, activations, edit_layers, hidden_edit, retained_factor,
                                              retained_system, solve_edit, wanted_change, with_bias)


def _model(seed: int = 0, act: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), act or nn.ReLU(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def _rows(n: int, seed: int) -> Tensors:
    generator = torch.Generator().manual_seed(seed)
    return Tensors(torch.randn(n, 6, generator=generator), torch.randint(0, 4, (n,), generator=generator),
                   np.arange(n))


def test_the_wanted_change_reaches_the_target_through_the_active_units_only():
    model, rows = _model(), _rows(5, 1)
    layers = edit_layers(model)
    acts = activations(model, layers, rows.x)
    target = acts.z + torch.randn(acts.z.shape, generator=torch.Generator().manual_seed(2))
    change = wanted_change(acts, model[4].weight.detach(), target)
    assert torch.all(change[acts.u <= 0] == 0)
    moved = model[4](acts.h + change.float())
    torch.testing.assert_close(moved, target, atol=1e-4, rtol=1e-4)


def test_the_woodbury_solve_is_the_direct_one_and_hits_the_forget_rows_where_the_retained_term_is_weak():
    generator = torch.Generator().manual_seed(3)
    forget_c = with_bias(torch.randn(3, 16, generator=generator))
    change = torch.randn(3, 64, generator=generator, dtype=torch.float64)
    retained = with_bias(torch.randn(40, 16, generator=generator))
    system, _ = retained_system(retained, retained_weight=5.0, ridge=1e-3)
    edit, flops = solve_edit(forget_c, change, system)
    gram = system @ system.T
    direct = torch.linalg.solve(gram + forget_c.T @ forget_c, forget_c.T @ change)
    torch.testing.assert_close(edit, direct)
    assert flops > 0
    weak, _ = retained_system(retained, retained_weight=1e-9, ridge=1e-9)
    torch.testing.assert_close(forget_c @ solve_edit(forget_c, change, weak)[0], change, atol=1e-5, rtol=1e-5)


def test_the_retained_term_keeps_the_edit_off_the_retained_rows():
    model, forget, retained = _model(), _rows(2, 4), _rows(200, 5)
    layers = edit_layers(model)
    teacher = activations(model, layers, forget.x).z - 3.0
    factor = retained_factor(model, layers, retained, torch.Generator().manual_seed(6))
    moves = {}
    for weight in (1e-6, 100.0):
        system, _ = retained_system(factor, retained_weight=weight, ridge=1e-3)
        edit = hidden_edit(model, layers, forget, teacher, system)
        edited = _model()
        with torch.no_grad():
            edited[2].weight += edit.weight
            edited[2].bias += edit.bias
        moves[weight] = (edited(retained.x) - model(retained.x)).abs().mean().item()
    assert moves[100.0] < 0.5 * moves[1e-6]


def test_a_clients_factor_keeps_its_rows_gram_not_its_rows():
    model, rows = _model(), _rows(30, 7)
    layers = edit_layers(model)
    factor = retained_factor(model, layers, rows, torch.Generator().manual_seed(8))
    plain = with_bias(activations(model, layers, rows.x).c)
    torch.testing.assert_close(factor.T @ factor, plain.T @ plain)
    assert not torch.allclose(factor, plain)


def test_models_without_a_relu_between_their_last_two_linear_layers_are_refused_by_name():
    with pytest.raises(EditUnsupported, match="fewer than two nn.Linear"):
        edit_layers(nn.Sequential(nn.Flatten(), nn.Linear(6, 4)))
    tanh = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 4))
    with pytest.raises(EditUnsupported, match="does not end Linear → ReLU → Linear"):
        activations(tanh, edit_layers(tanh), _rows(3, 9).x)


def test_a_later_pass_edits_only_the_targets_still_predicted_with_their_label():
    model, forget = _model(), _rows(6, 10)
    layers = edit_layers(model)
    acts = activations(model, layers, forget.x)
    predicted = acts.z.argmax(dim=1)
    factor = retained_factor(model, layers, _rows(100, 11), torch.Generator().manual_seed(12))
    system, _ = retained_system(factor, retained_weight=1.0, ridge=1e-3)
    wrong = Tensors(forget.x, (predicted + 1) % 4, forget.sample_ids)          # no row predicted with its label
    none = hidden_edit(model, layers, wrong, acts.z - 3.0, system, only_predicted=True)
    assert not none.weight.any() and not none.bias.any() and none.solve_flops == 0 and none.forward_rows == 6
    right = Tensors(forget.x, predicted, forget.sample_ids)
    some = hidden_edit(model, layers, right, acts.z - 3.0, system, only_predicted=True)
    assert some.weight.abs().sum() > 0 and some.solve_flops > 0
