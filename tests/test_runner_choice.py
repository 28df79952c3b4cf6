"""The engine choice of ``fedunlearn train|process --runner`` (fedunlearn.runner_choice), without a
workspace or Flower: which engine, which tag, what Flower refuses before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedunlearn.config import Runner, ScenarioConfig
from fedunlearn.errors import InputError
from fedunlearn.runner_choice import (check_flower_training, choose_runner, dropped_fallbacks, flower_attempts,
                                      flower_engine, runtime_tag, split_train_runner, training_runner)
from fedunlearn.unlearning.escalation import Attempt

SUPPORTED = {"puf-special": {"eta_u", "max_recovery_rounds", "target_test_acc"}, "hf-kcu": {"beta"}}


def test_train_runner_flag_keeps_task_runners_and_names_engines():
    assert split_train_runner(None) == ("thread", None)
    assert split_train_runner("dask") == ("dask", None)
    assert split_train_runner("flower") == ("thread", Runner.flower)
    assert split_train_runner("flower-simulation") == ("thread", Runner.flower_simulation)
    assert split_train_runner("in-process") == ("thread", Runner.in_process)


def test_command_beats_scenario_beats_default():
    assert choose_runner(None, None) is Runner.in_process
    assert choose_runner(None, "flower") is Runner.flower
    assert choose_runner("in-process", Runner.flower) is Runner.in_process
    with pytest.raises(ValueError):
        choose_runner("flwr", None)


def test_a_retrained_reference_stays_in_process_unless_asked():
    assert training_runner(None, Runner.flower, "original") is Runner.flower
    assert training_runner(None, Runner.flower, "retrained") is Runner.in_process
    assert training_runner("flower-simulation", None, "retrained") is Runner.flower_simulation


def test_runtime_tags():
    assert [runtime_tag(r) for r in Runner] == ["in-process", "flower-deployment", "flower-simulation"]
    assert flower_engine(Runner.in_process) is None and flower_engine(Runner.flower) == "deployment"


def test_scenario_params_default_in_process_and_accept_runner():
    assert ScenarioConfig(dataset="digits", setting="hfl").runner is Runner.in_process
    assert ScenarioConfig(dataset="digits", setting="hfl", runner="flower").runner is Runner.flower
    with pytest.raises(ValueError):
        ScenarioConfig(dataset="digits", setting="hfl", runner="ray")


def test_flower_refuses_other_settings_backdoor_and_local_epochs():
    check_flower_training(Runner.in_process, "s", "vfl", backdoor=True, local_epochs=3)
    check_flower_training(Runner.flower, "s", "hfl")
    for kwargs in ({"setting": "vfl"}, {"setting": "hfl", "backdoor": True}, {"setting": "hfl", "local_epochs": 2}):
        with pytest.raises(InputError, match="--runner flower"):
            check_flower_training(Runner.flower, "s", **kwargs)


def test_flower_attempts_keep_supported_drop_default_fallbacks_and_end_exactly():
    chain = [Attempt(method="puf-special"), Attempt(method="puf-special", options={"eta_u": 4.0}),
             Attempt(method="ga"), Attempt(method="retrain")]
    assert flower_attempts(Runner.in_process, chain, SUPPORTED, False) == chain
    kept = flower_attempts(Runner.flower, chain, SUPPORTED, False)
    assert [a.method for a in kept] == ["puf-special", "puf-special", "retrain"]


def test_the_fallbacks_a_flower_runner_drops_are_named_in_a_warning():
    chain = [Attempt(method="puf-special"), Attempt(method="puf-special", options={"eta_u": 4.0}),
             Attempt(method="ga"), Attempt(method="finetune"), Attempt(method="fedquit"), Attempt(method="retrain")]
    kept = flower_attempts(Runner.flower_simulation, chain, SUPPORTED, False)
    line = dropped_fallbacks(Runner.flower_simulation, chain, kept)
    assert line.startswith("runner flower-simulation: the escalation's fallback(s) ga, finetune, fedquit have no "
                           "Flower version")
    assert "escalates puf-special -> puf-special -> retrain" in line
    assert dropped_fallbacks(Runner.in_process, chain, flower_attempts(Runner.in_process, chain, SUPPORTED, False)) \
        is None
    assert dropped_fallbacks(Runner.flower, chain[:2] + chain[-1:], chain[:2] + chain[-1:]) is None


def test_a_chosen_method_keeps_the_default_chain_whose_fallbacks_flower_lacks_are_dropped():
    """``process --method hf-kcu --runner flower``: the user chose the first attempt, not FedQuit, which
    the default chain adds after it; the batch drops it (and says so) rather than refusing the batch."""
    from fedunlearn.unlearning.escalation import default_escalation
    from tasks.unlearning import flower_methods

    chain = default_escalation("hfl", "sample", Attempt(method="hf-kcu"))
    kept = flower_attempts(Runner.flower, chain, flower_methods(), False)
    assert [a.method for a in kept] == ["hf-kcu", "hf-kcu", "puf-regular", "retrain"]
    assert "fallback(s) fedquit have no Flower version" in dropped_fallbacks(Runner.flower, chain, kept)


def test_the_batch_carries_the_warning_to_the_cli(monkeypatch, capsys):
    """``fedunlearn process`` prints the batch's warnings beside its outcome (the flow logs them too)."""
    import cli.pipeline as pipeline
    from flows.results import ProcessResult

    result = ProcessResult(scenario="s", resumed=[], quarantined=[], already_applied=[], left_pending=[], waiting={},
                           status="nothing to process", warnings=["runner flower: ga left out"])
    for name in ("require_scenario", "require_methods", "require_data_for_requests", "prepare_flow_run", "print_summary"):
        monkeypatch.setattr(pipeline, name, lambda *args, **kwargs: None)
    monkeypatch.setattr("flows.process.process_deletions", lambda **kwargs: result)
    monkeypatch.setattr("stores.workspace.init_workspace", lambda root: None)
    args = argparse.Namespace(scenario="s", method="auto", retrain=False, method_options={}, device=None, verbose=False,
                                       forgetting_policy=None, runner="flower")
    assert pipeline.run_process(args, Path(".")) == 0
    assert "warning: runner flower: ga left out" in capsys.readouterr().out


def test_flower_attempts_refuse_a_chosen_method_or_option_flower_lacks():
    with pytest.raises(InputError, match="'fedquit'.*runner flower-simulation"):
        flower_attempts(Runner.flower_simulation, [Attempt(method="fedquit")], SUPPORTED, False)
    with pytest.raises(InputError, match="'ga'.*runner flower"):
        flower_attempts(Runner.flower, [Attempt(method="puf-special"), Attempt(method="ga")], SUPPORTED, True)
    with pytest.raises(InputError, match="max_doublings"):
        flower_attempts(Runner.flower, [Attempt(method="puf-special", options={"max_doublings": 2})], SUPPORTED,
                        True)


def test_the_ui_forms_have_the_runner_with_its_description():
    from flows.process import process_deletions
    from flows.train import train_federated

    for flow in (train_federated, process_deletions):
        field = flow.parameters.properties["runner"]
        assert field["default"] is None and "flower-simulation" in field["description"]


def test_flower_methods_are_the_apps_with_their_options():
    from tasks.unlearning import flower_methods

    methods = flower_methods()
    assert set(methods) == {"puf-special", "puf-regular", "hf-kcu"}
    assert {"eta_u", "max_recovery_rounds", "target_test_acc"} <= methods["puf-special"]
    assert "max_doublings" not in methods["puf-special"]
