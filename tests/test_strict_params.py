"""params.yaml and the command line taken strictly and within bounds: a YAML alias bomb, a 5,000-deep
list, a key given twice, an unknown or mistyped key, a quoted or boolean number, a number past its
range, a name that is a path; a client that is not in the scenario, a hold's reason with escape codes
or 100 KB long; a damaged receipt named by its path; a syntax error reported where it starts. Each
is one line naming what to fix. Pure parsing: no training, no server."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from fedunlearn.config import MAX_DAYS, load_params
from fedunlearn.errors import InputError, StateDamaged
from fedunlearn.params_yaml import MAX_DEPTH, MAX_VALUES
from fedunlearn.receipts import read_receipt, read_receipts
from fedunlearn.requests.folders import RECEIPTS_DIR
from fedunlearn.requests.model import DeletionRequestModel
from fedunlearn.transparency.log import all_receipts
from workspaces import PROJECT_ROOT, call_cli

PARAMS = (PROJECT_ROOT / "params.yaml").read_text()
DIGITS = "  digits-hfl:           # tiny, for tests and quick looks\n"


def params_with(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def edited(old: str, new: str) -> str:
    assert PARAMS.count(old) >= 1, old
    return PARAMS.replace(old, new, 1)


def refusal(tmp_path: Path, text: str) -> str:
    """The one-line message load_params refuses ``text`` with."""
    with pytest.raises(InputError) as raised:
        load_params(params_with(tmp_path, text))
    message = str(raised.value)
    assert "\n" not in message and "pydantic" not in message and "validation error" not in message, message
    return message


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


# --- YAML bounded ---------------------------------------------------------------------------------

def test_a_billion_laughs_alias_bomb_is_refused_at_once(tmp_path):
    bomb = "a: &a [" + ",".join(["lol"] * 10) + "]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 10) + "]\n" for i in range(9))
    assert len(bomb) < 1024  # stands for 10^10 values
    started = time.monotonic()
    message = refusal(tmp_path, bomb)
    assert time.monotonic() - started < 1.0
    assert f"more than {MAX_VALUES} values once its aliases" in message and "line " in message


def test_small_aliases_and_merge_keys_still_work(tmp_path):
    text = edited("scenarios:\n", "base_train: &train {rounds: 2, local_epochs: 3, lr: 0.1, batch_size: 16}\n"
                                  "scenarios:\n").replace("    train: {rounds: 2, local_epochs: 3, lr: 0.05, momentum: 0.9, batch_size: 16}",
                                                          "    train: {<<: *train, rounds: 4}", 1)
    # base_train is not a params key: the alias is expanded, then the unknown key refused by name
    assert "base_train is not a known key" in refusal(tmp_path, text)
    text = edited("    train: {rounds: 2, local_epochs: 3, lr: 0.05, momentum: 0.9, batch_size: 16}",
                  "    train: &train {rounds: 2, local_epochs: 3, lr: 0.1, batch_size: 16}")
    text = text.replace("    train: {rounds: 20, local_epochs: 5, lr: 0.05, momentum: 0.9, batch_size: 16}",
                        "    train: {<<: *train, rounds: 7}", 1)
    canary = load_params(params_with(tmp_path, text)).scenario("digits-canary-hfl").train
    assert (canary.rounds, canary.local_epochs, canary.batch_size) == (7, 3, 16)


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    assert "refers to a value that contains it" in refusal(tmp_path, "seed: &a [*a]\n")


@pytest.mark.parametrize("deep", ["x: " + "[" * 5000 + "]" * 5000 + "\n", "x:\n" + "- " * 5000 + "a\n"])
def test_a_5000_deep_list_is_one_line_not_a_recursion_error(tmp_path, deep):
    started = time.monotonic()
    message = refusal(tmp_path, deep)
    assert time.monotonic() - started < 1.0
    assert f"nested deeper than {MAX_DEPTH} levels" in message and f"{tmp_path / 'params.yaml'} is refused at line" in message


def test_a_key_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path):
    text = edited("  urgent_hours: 72\n", "  urgent_hours: 72\n  deadline_days: 3\n")
    first, second = line_of(text, "deadline_days: 30"), line_of(text, "urgent_hours: 72") + 1
    message = refusal(tmp_path, text)
    assert f"line {second}, column 3: the key 'deadline_days' is given twice (first at line {first})" in message
    assert "line 1, column 11: the key 'b' is given twice (first at line 1)" in refusal(tmp_path, "a: {b: 1, b: 2}\n")


# --- keys, types, ranges, names ----------------------------------------------------------------------

def test_an_unknown_or_mistyped_key_is_named_with_the_allowed_ones(tmp_path):
    message = refusal(tmp_path, edited("train: {rounds: 2, local_epochs: 3", "train: {roundz: 2, local_epochs: 3"))
    assert "scenarios.digits-hfl.train.roundz is not a known key: did you mean 'rounds'?" in message
    assert "allowed here: rounds, local_epochs, lr, batch_size, momentum, client_fraction, server_lr" in message
    assert "https://" not in message and f"Fix it in {tmp_path / 'params.yaml'}" in message
    assert "colour is not a known key: allowed here: seed, device," in refusal(tmp_path, PARAMS + "colour: red\n")


@pytest.mark.parametrize("value, said", [('"3"', "'3' is not an integer (write it without quotes)"),
                                         ("true", "true is not an integer"), ("2.0", "2.0 is not an integer")])
def test_shards_must_be_an_integer_not_a_text_or_a_boolean(tmp_path, value, said):
    message = refusal(tmp_path, edited(DIGITS, f"{DIGITS}    shards: {value}\n"))
    assert f"scenarios.digits-hfl.shards: {said}" in message


def test_numbers_stay_in_range_and_a_float_field_takes_an_integer(tmp_path):
    message = refusal(tmp_path, edited("deadline_days: 30", "deadline_days: 1e308"))
    assert f"requests.deadline_days: 1e+308 is out of range; allowed: > 0 and ≤ {MAX_DAYS}" in message
    assert "not a finite number" in refusal(tmp_path, edited("deadline_days: 30", "deadline_days: .inf"))
    assert "is not a number" in refusal(tmp_path, edited("deadline_days: 30", "deadline_days: '30'"))
    assert "seed: -1 is out of range; allowed: ≥ 0 and ≤ 4294967295" in refusal(tmp_path, edited("seed: 0", "seed: -1"))
    params = load_params(params_with(tmp_path, edited("deadline_days: 30", f"deadline_days: {MAX_DAYS}")
                                     .replace("lr: 0.05, momentum: 0.9, batch_size: 16}", "lr: 1, momentum: 0.9, batch_size: 16}", 1)))
    assert params.requests.deadline_days == MAX_DAYS and params.scenario("digits-hfl").train.lr == 1.0
    # the largest deadline a request can get stays a date (1e308 days overflowed `status`)
    assert DeletionRequestModel(kind="client", client=0).due(params.requests.deadline_days).year < 9999
    assert load_params(params_with(tmp_path, edited("deadline_days: 30", "deadline_days: 3e1"))).requests.deadline_days == 30


@pytest.mark.parametrize("old, new, where", [
    (DIGITS, "  ../../../tmp/evil:\n", "scenarios: '../../../tmp/evil' is not a name"),
    ("    dataset: digits\n", "    dataset: ../digits\n", "scenarios.digits-hfl.dataset: '../digits' is not a name"),
    ("datasets: {}", "datasets: {'../x': {source: csv}}", "datasets: the dataset name '../x' is not a name"),
    ("prepare: [mnist5k,", "prepare: [/etc,", "prepare.0: '/etc' is not a name"),
])
def test_scenario_and_dataset_names_are_names_not_paths(tmp_path, old, new, where):
    message = refusal(tmp_path, edited(old, new))
    assert where in message and "starting with a letter or digit" in message


def test_a_bad_value_is_one_line_naming_the_key_path(tmp_path):
    message = refusal(tmp_path, edited("lr: 0.05, momentum: 0.9, batch_size: 16}", "lr: -1, momentum: 0.9, batch_size: 16}"))
    assert message == (f"{tmp_path / 'params.yaml'}: scenarios.digits-hfl.train.lr: -1 is out of range; allowed: > 0. "
                       f"Fix it in {tmp_path / 'params.yaml'} and run the command again; nothing was changed")
    several = edited("urgent_hours: 72", "urgent_hours: -1").replace("batch_threshold: 10", "batch_threshold: 0") \
        .replace("max_wait_hours: 24", "max_wait_hours: x").replace("max_retrain_debt: 50", "max_retrain_debt: y")
    assert "(and 1 more)" in refusal(tmp_path, several)


# --- YAML syntax errors where they start ---------------------------------------------------------------

@pytest.mark.parametrize("old, new", [
    ("    train: {rounds: 2, local_epochs: 3, lr: 0.05, momentum: 0.9, batch_size: 16}",
     "    train: {rounds: 2, local_epochs: 3, lr: 0.1, batch_size: 16"),  # an unclosed bracket, comments after it
    ("device: auto            # auto = cuda, then mps, then cpu", 'device: "auto'),  # an unclosed quote
    ("  inbox_grace_seconds: 300", "  inbox_grace_seconds 300"),  # a missing ':'
])
def test_a_syntax_error_is_reported_at_the_line_where_it_starts(tmp_path, old, new):
    text = edited(old, new)
    message = refusal(tmp_path, text)
    assert f"is not valid YAML at line {line_of(text, new)}, column " in message, message
    assert "noticed it at line" in message or "runs on to line" in message


# --- the command line ---------------------------------------------------------------------------------

@pytest.mark.parametrize("client", ["-1", "3", "12345678901234567890"])
def test_a_client_request_names_a_client_of_the_scenario_before_anything_is_written(workspace, client):
    printed = call_cli(workspace, "request", "client", "--scenario", "digits-hfl", "--client", client)
    assert printed.status == InputError.exit_code and printed.err.count("\n") == 1, printed
    assert f"--client {client}: digits-hfl has clients 0 to 2 (partition.num_clients: 3)" in printed.err
    assert not list((workspace / "data/deletion_requests/inbox").glob("*.json"))
    printed = call_cli(workspace, "request", "client", "--scenario", "wine-vfl", "--client", "0")
    assert printed.status == InputError.exit_code and "is vertical (VFL)" in printed.err
    assert not list((workspace / "data/deletion_requests/inbox").glob("*.json"))


@pytest.mark.parametrize("reason, said", [("audit \x1b[2J\x1b[31mgone", r"control character ('\x1b', character 7)"),
                                          ("line one\nline two", r"control character ('\n', character 9)"),
                                          ("x" * 100_000, "100000 characters long, over the limit of 500")])
def test_a_hold_reason_is_plain_text_within_its_limit(workspace, reason, said):
    printed = call_cli(workspace, "hold", "1", "--scenario", "digits-hfl", "--reason", reason)
    assert printed.status == InputError.exit_code and printed.err.count("\n") == 1, printed
    assert said in printed.err and "\x1b" not in printed.err and len(printed.err) < 400


def test_a_request_reason_is_plain_text_too(workspace):
    printed = call_cli(workspace, "request", "client", "--scenario", "digits-hfl", "--client", "0",
                       "--reason", "asked \x1b]8;;http://x\x07here")
    assert printed.status == InputError.exit_code and r"control character ('\x1b', character 7)" in printed.err
    assert not list((workspace / "data/deletion_requests/inbox").glob("*.json"))


def test_every_option_and_argument_says_what_it_is():
    from cli import COMMAND_MODULES, build_parser

    missing = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    walk(sub, f"{name} {command}")
            elif not action.help:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(COMMAND_MODULES), "fedunlearn")
    assert not missing, missing


# --- a damaged receipt --------------------------------------------------------------------------------

def test_a_damaged_receipt_is_named_by_its_path(tmp_path):
    path = tmp_path / RECEIPTS_DIR / "b1.json"
    path.parent.mkdir(parents=True)
    for damaged in ('{"batch_id": "b1", "scenario": "digits-hfl"', json.dumps({"batch_id": "b1"})):
        path.write_text(damaged)
        for read in (lambda: read_receipts(tmp_path, "digits-hfl"), lambda: read_receipt(tmp_path, "b1"),
                     lambda: all_receipts(tmp_path)):
            with pytest.raises(StateDamaged, match=rf"^{path} is not a readable receipt \(.*\): restore it") as raised:
                read()
            assert "validation error for Receipt" not in str(raised.value) and "\n" not in str(raised.value)
