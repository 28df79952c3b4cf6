"""The engine choice of ``fedunlearn train|process --runner`` (fedunlearn.runtime_choice), without a
workspace or Flower: which engine, which tag, what Flower refuses before anything runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedunlearn.config import Runtime, ScenarioConfig
from fedunlearn.errors import InputError
from fedunlearn.runtime_choice import (check_flower_training, choose_runtime, flower_attempts, flower_engine,
                                      in_process_fallbacks, runtime_tag, split_train_runner, training_runtime)
from fedunlearn.unlearning.escalation import Attempt

SUPPORTED = {"puf-special": {"eta_u", "max_recovery_rounds", "target_test_acc"}, "hf-kcu": {"beta"}}


def test_train_runner_flag_keeps_task_runners_and_names_engines():
    assert split_train_runner(None) == ("thread", None)
    assert split_train_runner("dask") == ("dask", None)
    assert split_train_runner("flower") == ("thread", Runtime.flower)
    assert split_train_runner("flower-simulation") == ("thread", Runtime.flower_simulation)
    assert split_train_runner("in-process") == ("thread", Runtime.in_process)


def test_command_beats_scenario_beats_default():
    assert choose_runtime(None, None) is Runtime.in_process
    assert choose_runtime(None, "flower") is Runtime.flower
    assert choose_runtime("in-process", Runtime.flower) is Runtime.in_process
    with pytest.raises(ValueError):
        choose_runtime("flwr", None)


def test_a_retrained_reference_stays_in_process_unless_asked():
    assert training_runtime(None, Runtime.flower, "original") is Runtime.flower
    assert training_runtime(None, Runtime.flower, "retrained") is Runtime.in_process
    assert training_runtime("flower-simulation", None, "retrained") is Runtime.flower_simulation


def test_runtime_tags():
    assert [runtime_tag(r) for r in Runtime] == ["in-process", "flower-deployment", "flower-simulation"]
    assert flower_engine(Runtime.in_process) is None and flower_engine(Runtime.flower) == "deployment"


def test_scenario_params_default_in_process_and_accept_runner():
    assert ScenarioConfig(dataset="digits", setting="hfl").runner is Runtime.in_process
    assert ScenarioConfig(dataset="digits", setting="hfl", runner="flower").runner is Runtime.flower
    with pytest.raises(ValueError):
        ScenarioConfig(dataset="digits", setting="hfl", runner="ray")


def test_flower_refuses_other_settings_backdoor_and_local_epochs():
    check_flower_training(Runtime.in_process, "s", "vfl", backdoor=True, local_epochs=3)
    check_flower_training(Runtime.flower, "s", "hfl")
    for kwargs in ({"setting": "vfl"}, {"setting": "hfl", "backdoor": True}, {"setting": "hfl", "local_epochs": 2}):
        with pytest.raises(InputError, match="--runner flower"):
            check_flower_training(Runtime.flower, "s", **kwargs)


def test_flower_attempts_keep_the_default_fallbacks_flower_lacks_to_run_in_process():
    chain = [Attempt(method="puf-special"), Attempt(method="puf-special", options={"eta_u": 4.0}),
             Attempt(method="ga"), Attempt(method="retrain")]
    assert flower_attempts(Runtime.in_process, chain, SUPPORTED, False) == chain
    assert flower_attempts(Runtime.flower, chain, SUPPORTED, False) == chain


def test_a_fallback_without_a_flower_version_is_named_in_a_warning_saying_it_runs_in_process():
    """No silent fallback: a batch on a Flower runner whose escalation holds methods Flower's app lacks
    warns, naming each and that it runs in-process; nothing to say when all run on Flower."""
    chain = [Attempt(method="puf-special"), Attempt(method="puf-special", options={"eta_u": 4.0}),
             Attempt(method="ga"), Attempt(method="finetune"), Attempt(method="fedquit"), Attempt(method="retrain")]
    line = in_process_fallbacks(Runtime.flower_simulation, chain, SUPPORTED)
    assert line.startswith("runner flower-simulation: the escalation's fallback(s) ga, finetune, fedquit have no "
                           "Flower version and run in-process")
    assert in_process_fallbacks(Runtime.in_process, chain, SUPPORTED) is None
    assert in_process_fallbacks(Runtime.flower, chain[:2] + chain[-1:], SUPPORTED) is None


def test_the_default_chain_runs_on_flower_from_first_attempt_to_last_resort():
    """``process --method hf-kcu --runner flower``: every method of the default chain — the fallback,
    FedQUIT the last resort — has a Flower version, so the batch has nothing to warn of."""
    from fedunlearn.unlearning.escalation import default_escalation
    from tasks.unlearning import flower_methods

    for kind, first in (("sample", "hf-kcu"), ("sample", "puf-special"), ("client", "puf-special"),
                        ("class", "puf-special")):
        chain = default_escalation("hfl", kind, Attempt(method=first))
        assert flower_attempts(Runtime.flower, chain, flower_methods(), False) == chain
        assert in_process_fallbacks(Runtime.flower, chain, flower_methods()) is None, (kind, first)
    chain = default_escalation("hfl", "sample", Attempt(method="hf-kcu"))
    assert [a.method for a in chain] == ["hf-kcu", "hf-kcu", "puf-regular", "fedquit", "fedquit", "retrain"]


def test_an_attempt_without_a_flower_version_runs_in_process_and_the_batch_warns(monkeypatch):
    """The attempt itself (``flows.unlearn.attempt_outcome``) on a Flower runner: a method the app has
    goes through Flower; one it lacks runs in-process, and the batch logs a warning naming it."""
    import flows.unlearn as unlearn

    calls: list[str] = []
    monkeypatch.setattr(unlearn, "flower_methods", lambda: SUPPORTED)
    monkeypatch.setattr(unlearn, "unlearn_through_flower",
                        lambda *args: calls.append(f"flower {args[4]}") or (None, None))
    monkeypatch.setattr(unlearn, "unlearn_in_gpu_slot", lambda *args: calls.append(f"in-process {args[2]}") or (None, None))
    messages: list[str] = []

    class Logger:
        def warning(self, message, *args):
            messages.append(message % args)

    monkeypatch.setattr(unlearn, "get_run_logger", lambda: Logger())
    batch = argparse.Namespace(runtime=Runtime.flower, record=argparse.Namespace(scenario="s"), registered={})
    inputs = unlearn.Unlearning(source=argparse.Namespace(state={}), source_test_acc=0.9, setup=None)

    def step(method: str, number: int):
        return unlearn.Step(Attempt(method=method), number, 4)

    unlearn.attempt_outcome(None, batch, inputs, step("puf-special", 0))
    unlearn.attempt_outcome(None, batch, inputs, step("ga", 2))
    assert calls == ["flower puf-special", "in-process ga"]
    assert messages == ["attempt 3 (ga) runs in-process: ga has no Flower version (Flower engine deployment)"]
    batch.runtime = Runtime.in_process
    unlearn.attempt_outcome(None, batch, inputs, step("ga", 2))
    assert calls[-1] == "in-process ga" and len(messages) == 1  # the in-process runner: nothing to warn of


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
        flower_attempts(Runtime.flower_simulation, [Attempt(method="fedquit")], SUPPORTED, False)
    with pytest.raises(InputError, match="'ga'.*runner flower"):
        flower_attempts(Runtime.flower, [Attempt(method="puf-special"), Attempt(method="ga")], SUPPORTED, True)
    with pytest.raises(InputError, match="max_doublings"):
        flower_attempts(Runtime.flower, [Attempt(method="puf-special", options={"max_doublings": 2})], SUPPORTED,
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
    assert set(methods) == {"puf-special", "puf-regular", "hf-kcu", "ga", "finetune", "fedquit"}
    assert {"eta_u", "max_recovery_rounds", "target_test_acc"} <= methods["puf-special"]
    assert "max_doublings" not in methods["puf-special"]
