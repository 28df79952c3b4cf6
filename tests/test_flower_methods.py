"""The Flower versions of gradient ascent, fine-tuning and FedQUIT (issue 45, item 6): each gives the
in-process method's model on the same data and seed, and FedQUIT's quitting term reaches only the
forget samples the batch's ``remembered`` names. They run the ServerApp and the ClientApp's handlers
on ``LoopbackGrid`` (the messages and records of a federation, in this process: seconds); the same
methods on Flower's simulation engine are in tests/reliability/test_flower_engines.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flower_helpers import SCENARIO, in_process, max_difference, prepared_workspace, sample_batch, \
    unlearned_on_loopback


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """digits-hfl trained for the scenario's rounds, whose count numbers the unlearning's rounds."""
    from fedunlearn_flower.partition import Scenario

    workspace = prepared_workspace(tmp_path_factory.mktemp("flower-methods") / "workspace")
    return workspace, in_process(workspace, rounds=Scenario.load(workspace, SCENARIO).config.train.rounds)


def _in_process(fed, batch, method: str, **params) -> dict:
    from fedunlearn.unlearning import get_method

    return get_method(method, setting="hfl", **params).unlearn(fed, batch).state


@pytest.mark.parametrize("method, params, messages", [
    ("finetune", {"rounds": 1}, {"train"}),
    ("ga", {"epochs": 2, "recovery_rounds": 1}, {"train", "train.ascent"}),
    ("fedquit", {"solver": "steps", "rounds": 2, "recovery_rounds": 1}, {"train", "train.fedquit"}),
])
def test_a_flower_method_gives_the_in_process_model(trained, tmp_path, method, params, messages):
    workspace, fed = trained
    batch = sample_batch(workspace)
    unlearned, notes, sent = unlearned_on_loopback(workspace, tmp_path, fed.state, method, params, batch)
    assert max_difference(unlearned, _in_process(fed, batch, method, **params)) <= 1e-5
    assert max_difference(unlearned, fed.state) > 1e-3  # the method moved the model
    assert set(sent) == {"query.partition"} | messages and notes["target_clients"] == [1]


def test_flower_fedquit_applies_the_quitting_term_only_to_remembered_samples(trained, tmp_path):
    """With ``remembered`` naming 4 of the 10 forget samples, the Flower FedQUIT is the in-process one
    with the same evidence — not the one that quits all 10 — and the 6 others are predicted as the
    in-process version predicts them: left to what the retained data teaches."""
    workspace, fed = trained
    batch = sample_batch(workspace)
    remembered = batch.with_remembered(batch.forget_ids[1][:4].tolist())
    params = {"solver": "steps", "rounds": 2, "recovery_rounds": 0}
    unlearned, notes, _ = unlearned_on_loopback(workspace, tmp_path, fed.state, "fedquit", params,
                                                type(batch).from_dict(remembered.to_dict()))
    expected = _in_process(fed, remembered, "fedquit", **params)
    assert max_difference(unlearned, expected) <= 1e-5
    assert max_difference(unlearned, _in_process(fed, batch, "fedquit", **params)) > 1e-3
    assert notes["quitting_samples"] == 4 and notes["target_clients"] == [1]

    others = fed.forget_by_client(batch)[1].select(~np.isin(batch.forget_ids[1], remembered.remembered))
    assert len(others) == 6
    assert torch.equal(_predictions(fed, unlearned, others), _predictions(fed, expected, others))


def test_flower_fedquit_with_nothing_remembered_quits_no_sample(trained, tmp_path):
    """Evidence that the source remembers none of the forget samples: no client gets the teacher, and
    the rounds are FedQUIT's local steps on the retained data alone, as in-process."""
    workspace, fed = trained
    batch = sample_batch(workspace).with_remembered([])
    params = {"solver": "steps", "rounds": 1, "recovery_rounds": 0}
    unlearned, notes, _ = unlearned_on_loopback(workspace, tmp_path, fed.state, "fedquit", params, batch)
    assert notes["quitting_samples"] == 0 and notes["target_clients"] == []
    assert max_difference(unlearned, _in_process(fed, batch, "fedquit", **params)) <= 1e-5


def _predictions(fed, state: dict, data) -> torch.Tensor:
    model = fed.model_from(state)
    model.eval()
    with torch.no_grad():
        return model(data.x).argmax(dim=1)


def test_the_flower_methods_wrap_the_registry_methods_with_their_defaults():
    """Every Flower version wraps the registry's in-process method under its name: the same
    settings and defaults, but those its protocol pins (FedQUIT's steps, PUF's and HF-KCU's ladder)."""
    from fedunlearn.unlearning.registry import get_method_class
    from fedunlearn_flower.server_app import ALGORITHMS

    assert set(ALGORITHMS) == {"puf-special", "puf-regular", "hf-kcu", "ga", "finetune", "fedquit"}
    for name, flower in ALGORITHMS.items():
        ours = get_method_class(name, "hfl")
        assert flower.in_process is ours, name
        assert flower().method.get_params() == {**ours.defaults(), **flower.pinned}, name
    assert ALGORITHMS["fedquit"].pinned["solver"] == "steps"


def test_a_pinned_setting_is_refused_over_flower():
    from fedunlearn_flower.server_app import ALGORITHMS

    for name, setting, value in (("fedquit", "solver", "edit"), ("fedquit", "retained_rows", 10),
                                 ("puf-special", "max_doublings", 2), ("hf-kcu", "lanczos_steps", 5)):
        with pytest.raises(ValueError, match="runs in-process only"):
            ALGORITHMS[name](**{setting: value})
    assert ALGORITHMS["puf-regular"](eta_r=0.5).method.eta_r == 0.5
    # What the runtime lets a batch name on Flower: a pinned setting only where it departs from the default.
    assert "solver" in ALGORITHMS["fedquit"].options() and "retained_rows" not in ALGORITHMS["fedquit"].options()
    assert "max_doublings" not in ALGORITHMS["puf-special"].options() and "eta_u" in ALGORITHMS["puf-special"].options()


def test_a_flower_method_refuses_what_the_in_process_method_refuses():
    from fedunlearn_flower.fedquit import FedQUIT
    from fedunlearn_flower.finetune import FineTune
    from fedunlearn_flower.gradient_ascent import GradientAscent

    for build in (lambda: FedQUIT(suppress="max"), lambda: FineTune(rounds=0), lambda: GradientAscent(epochs=0)):
        with pytest.raises(ValueError):
            build()
    # What its server cannot run as the in-process method does (recovery is unchecked FedAvg rounds there).
    for build in (lambda: FedQUIT(recovery_tolerance=0.01), lambda: FedQUIT(local_steps=5)):
        with pytest.raises(ValueError, match="run in-process only"):
            build()
    assert FedQUIT(local_steps=5, recovery_rounds=0, participants="holders").method.local_steps == 5
