"""What a user sees of a long step while it runs: on a terminal a bar redrawn in place, otherwise a
line a step, on stderr (stdout keeps the command's own lines); `--quiet` shows none. The core only
takes a callback (``train_audit_set``'s ``on_reference``); the flows report (``runtime.progress``)."""

from __future__ import annotations

import io

import numpy as np
import torch

from cli import parse_arguments, progress_shown
from cli.progress import ProgressPrinter, shown
from runtime import progress


def test_off_a_terminal_each_step_is_a_line_and_nothing_is_told_without_a_listener():
    progress.report("training toy", 1, 2)  # nobody listens: nothing happens, nothing fails
    stream = io.StringIO()
    with shown(stream):
        progress.report("training toy", 1, 2, "round 1/2, test_acc 0.5000")
        progress.report("training toy", 2, 2, "round 2/2, test_acc 0.7500")
    progress.report("training toy", 2, 2)  # the listener is gone with the block
    assert stream.getvalue() == ("  … training toy: round 1/2, test_acc 0.5000\n"
                                 "  … training toy: round 2/2, test_acc 0.7500\n")


def test_on_a_terminal_one_line_is_redrawn_and_ended_when_the_task_ends_or_another_begins():
    stream = io.StringIO()
    printer = ProgressPrinter(stream, tty=True)
    printer(progress.Step("attempts of b1", 0, 3, "attempt 1 of at most 3: puf-special"))
    printer(progress.Step("audit references", 1, 2))
    printer(progress.Step("audit references", 2, 2))
    printer(progress.Step("attempts of b1", 1, 3, "1 attempt(s)", final=True))
    printer(progress.Step("training toy", 1, 4))
    printer.close()  # the command ended mid-task: its line is ended
    lines = stream.getvalue().split("\n")
    assert lines[0].endswith("[........................] attempts of b1: attempt 1 of at most 3: puf-special")
    assert lines[1].split("\r\x1b[2K")[1:] == ["  [############............] audit references: 1/2",
                                              "  [########################] audit references: 2/2"]
    assert lines[2].endswith("attempts of b1: 1 attempt(s)") and lines[3].endswith("] training toy: 1/4")
    assert lines[4:] == [""]


def test_quiet_shows_no_progress_and_is_accepted_after_the_command():
    assert parse_arguments(["status", "--quiet"]).quiet and not parse_arguments(["status"]).quiet
    with progress_shown(parse_arguments(["--quiet", "status"])):
        assert progress._listeners == []
    with progress_shown(parse_arguments(["status"])):
        assert len(progress._listeners) == 1
    assert progress._listeners == []


def test_the_audit_references_tell_each_one_trained(tmp_path):
    from fedunlearn.config import AuditConfig
    from fedunlearn.evaluation.audit import train_audit_set
    from fedunlearn.federation.local import Tensors

    rng = np.random.default_rng(0)
    heldout = Tensors.from_arrays(rng.normal(size=(40, 4)).astype(np.float32), rng.integers(0, 2, 40),
                                  np.array([f"s{i}" for i in range(40)]), torch.device("cpu"))
    told = []
    train_audit_set(heldout, lambda: torch.nn.Linear(4, 2), config=AuditConfig(num_references=3, epochs=1),
                    on_reference=lambda k, n: told.append((k, n)))
    assert told == [(1, 3), (2, 3), (3, 3)]


def test_training_shows_each_round_on_stderr_and_leaves_stdout_as_it_was(workspace, prefect_server):
    from workspaces import call_cli

    trained = call_cli(workspace, "train", "--scenario", "digits-hfl", "--inline", "--rounds", "2")
    assert trained.status == 0, trained.err
    rounds = [line for line in trained.err.splitlines() if line.startswith("  … training digits-hfl: round")]
    assert [line.split(",")[0] for line in rounds] == ["  … training digits-hfl: round 1/2",
                                                        "  … training digits-hfl: round 2/2"], trained.err
    assert "…" not in trained.out and "registered version 1" in trained.out
