"""What the commands print (issue 37, "output that buries the story"): quiet by default (no library
INFO line, no "View at" link to the command's throwaway server, no library deprecation warning) and
the libraries' logs with --verbose; our markdown as plain text in a terminal; the reason a version
serves on the line that says it serves. The demo itself: tests/reliability/test_demo_output.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from datetime import datetime, timezone

import pytest

from cli import QUIET_SETTINGS, configure_output, parse_arguments
from cli.text import plain
from fedunlearn.certify.gates import GateCheck, GateOutcome
from fedunlearn.receipts import EscalationStep, ExactForgetting, ModelRef, Receipt

DUE = datetime(2026, 12, 27, 7, 42, tzinfo=timezone.utc)

# A flow run's INFO lines and a warning, logged the way Prefect's flow-run logger logs them, after
# the command's output settings: what the console shows, and whether Prefect's API handler (the UI)
# still takes INFO lines.
PROBE = """
import logging, sys, warnings
from cli import configure_output
configure_output(verbose=sys.argv[1] == "verbose")
from prefect.logging.configuration import ensure_logging_setup
from prefect.logging.handlers import APILogHandler
ensure_logging_setup()  # as a flow run does first
flow_runs = logging.getLogger("prefect.flow_runs")
run = {"flow_run_name": "probe", "flow_run_id": None}
flow_runs.info("Beginning flow run 'probe' for flow 'train-federated'", extra=run)
flow_runs.info("View at http://127.0.0.1:4200/runs/flow-run/1", extra=run)
flow_runs.warning("attempt 1 did not pass its gates: escalating", extra=run)
exec(compile("import warnings; warnings.warn('old API', DeprecationWarning)", "dvc/repo/trie.py", "exec"),
     {"__name__": "dvc.repo.trie"})
api = [h for h in flow_runs.handlers if isinstance(h, APILogHandler)]
print("api handler levels:", [h.level for h in api], "logger level:", flow_runs.getEffectiveLevel())
"""


def probe(mode: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in QUIET_SETTINGS}
    env["PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW"] = "ignore"  # no flow run here to send the lines to
    return subprocess.run([sys.executable, "-W", "default", "-c", PROBE, mode], capture_output=True, text=True,
                          env=env, check=True)


def test_by_default_the_console_has_no_library_info_line_but_the_prefect_api_still_gets_them():
    quiet = probe("quiet")
    assert "INFO" not in quiet.stderr and "View at" not in quiet.stderr and "Beginning flow run" not in quiet.stderr
    assert "DeprecationWarning" not in quiet.stderr, quiet.stderr
    assert "escalating" in quiet.stderr  # warnings stay on the console
    assert "api handler levels: [0] logger level: 20" in quiet.stdout  # the UI's run log keeps its INFO lines


def test_verbose_brings_the_library_logs_back():
    verbose = probe("verbose")
    assert "INFO" in verbose.stderr and "View at http://127.0.0.1:4200" in verbose.stderr
    assert "DeprecationWarning: old API" in verbose.stderr and "escalating" in verbose.stderr


def test_quiet_keeps_a_setting_the_user_exported_and_verbose_overrides_it(monkeypatch):
    for name in QUIET_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_LOGGING_LEVEL", "DEBUG")
    with warnings.catch_warnings():
        configure_output(verbose=False)
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == "DEBUG"
    assert os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "WARNING"
    configure_output(verbose=True)
    assert os.environ["MLFLOW_LOGGING_LEVEL"] == "INFO"
    assert os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] == "NOTSET"


def test_only_the_libraries_deprecations_are_silenced(monkeypatch):
    for name in QUIET_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    from cli.common import silence_library_deprecations

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure_output(verbose=False)
        warnings.filterwarnings("once", category=DeprecationWarning)  # as Flower's import does, later
        silence_library_deprecations()  # prepare_flow_run, once the flows are imported
        for module in ("dvc.repo.trie", "great_expectations.core", "mlflow.store", "fedunlearn.receipts",
                       "dvcx_not_dvc"):
            exec(compile(f"import warnings; warnings.warn('{module}', DeprecationWarning)", module, "exec"),
                 {"__name__": module})
    assert [str(w.message) for w in caught] == ["fedunlearn.receipts", "dvcx_not_dvc"]


def test_verbose_is_accepted_before_and_after_the_command():
    assert parse_arguments(["--verbose", "status"]).verbose and parse_arguments(["status", "--verbose"]).verbose
    assert not parse_arguments(["status"]).verbose
    assert parse_arguments(["request", "samples", "--ids", "a", "b", "--verbose"]).ids == ["a", "b"]
    assert parse_arguments(["serve"]).verbose  # its console is the served runs' log, its links stay alive
    with pytest.raises(SystemExit):
        parse_arguments(["status", "--loud"])


def test_plain_drops_bold_and_code_marks_and_aligns_tables():
    markdown = ("## Deletion batch `b1` (digits-hfl)\n\nForgetting: **interim** by `v2`; 2 ** 3 stays\n\n"
                "| version | aliases | note |\n|---|---|---|\n| 1 | original | a \\| b |\n| 12 | current,retrained | **x** |\n"
                "after")
    assert plain(markdown).splitlines() == [
        "Deletion batch b1 (digits-hfl)", "", "Forgetting: interim by v2; 2 ** 3 stays", "",
        "version  aliases            note",
        "-------  -----------------  -----",
        "1        original           a | b",
        "12       current,retrained  x",
        "after"]
    assert plain("no markdown here -> v2") == "no markdown here -> v2"


def test_plain_shows_an_escaped_reason_as_written():
    from tasks.status_lines import markdown_text

    reason = "field `ids`: **not** a list [got *] (see #3) a\\b | c_d"
    assert plain(markdown_text(reason)) == reason
    assert plain(f"| file | reason |\n|---|---|\n| r1 | {markdown_text(reason)} |").splitlines()[2].split(None, 1) == [
        "r1", reason]


def gate(name: str, verdict: str) -> GateCheck:
    return GateCheck(name=name, value=0.5, limit=0.05, passed=verdict == "pass", verdict=verdict)


def receipt(promoted: bool, forgetting: str | None, verdict: str = "inconclusive", held_back=()) -> Receipt:
    checks = [gate("test_acc_drop_vs_source", "pass"), gate("mia_auc_excess", verdict), gate("forget_audit", verdict)]
    outcome = GateOutcome.of("without reference", checks).model_copy(
        update={"interim": not held_back, "held_back": list(held_back),
                "unmeasured": ["no measurable membership signal"]})
    source = ModelRef(version="1", role="original")
    unlearned = ModelRef(version="2", role="unlearned")
    return Receipt(batch_id="batch-20261127T074200Z-1c46a5", scenario="mnist5k-hfl", request_ids=["req-a"],
                   deleted_samples=40, forgotten_per_client={"0": 25, "1": 15}, data_version_before="v0",
                   data_version_after="v1", method="puf-special",
                   models={"original": source, "source": source, "unlearned": unlearned,
                           "current": unlearned if promoted else source},
                   certificate={"guarantee": "empirical only"}, gates=outcome,
                   attempts=[EscalationStep(attempt=0, method="puf-special", version=unlearned, gates=outcome)],
                   promoted=promoted, metrics={"source": {"test_acc": math.nan}}, costs={},
                   forgetting=forgetting, exact_due=DUE if forgetting == "interim" else None,
                   batch_record="data/deletion_requests/batches/b.json")


def test_an_interim_version_serves_with_its_reason_on_the_same_line():
    interim = receipt(promoted=True, forgetting="interim")
    line = ("alias `current` → v2: serves on the **interim** tier — no check failed (mia_auc_excess, forget_audit "
            "inconclusive); exact forgetting due by 2026-12-27 07:42Z")
    assert interim.serve_line() == line
    assert f"\n\n{line}.\n\n" in interim.markdown()  # a paragraph of its own, right after method and gates
    assert "Not measurable: no measurable membership signal." in interim.markdown()
    passed = receipt(promoted=True, forgetting="interim", verdict="pass").serve_line()
    assert passed.startswith("alias `current` → v2: serves on the **interim** tier — every check passed; exact")
    repaid = interim.model_copy(update={"exactly_forgotten": ExactForgetting(at=DUE, version="3", by="repay")})
    assert repaid.serve_line().endswith("due by 2026-12-27 07:42Z — forgotten exactly at 2026-12-27 07:42Z by v3 "
                                        "(repay)")


def test_the_batch_s_own_latest_safe_start_is_named_as_the_batch_s():
    """The receipt's start time is this batch's; the debt's (a line apart in `process`) is the
    earliest over every batch owed: each says which it is."""
    from datetime import timedelta

    interim = receipt(promoted=True, forgetting="interim").model_copy(
        update={"exact_start_by": DUE - timedelta(hours=6)})
    owed = "exact forgetting due by 2026-12-27 07:42Z (this batch's latest safe start for the exact retrain: " \
           "2026-12-27 01:42Z)"
    assert interim.serve_line().endswith(owed) and owed in interim.tier_line()
    from flows.finish import unscheduled

    assert unscheduled("mnist5k-hfl", DUE - timedelta(hours=30), DUE - timedelta(hours=24)).endswith(
        "before 2026-12-26 01:42Z (the retrain debt's latest safe start: for its earliest deadline, 2026-12-26 "
        "07:42Z, over every batch it owes)")


def test_a_held_back_or_exact_version_says_why_on_the_same_line():
    held = receipt(promoted=False, forgetting=None, verdict="fail", held_back=["forget_audit fails: remembered"])
    assert held.serve_line() == "alias `current` NOT moved (stays at v1): held back — forget_audit fails: remembered"
    assert "Not measurable" not in held.markdown()
    strict = receipt(promoted=False, forgetting=None).model_copy(update={"policy": "strict"})
    assert strict.serve_line() == ("alias `current` NOT moved (stays at v1): held back — strict policy, only a pass "
                                   "serves: mia_auc_excess inconclusive; forget_audit inconclusive")
    exact = receipt(promoted=True, forgetting="exact").model_copy(update={"gates": None})
    assert exact.serve_line() == "alias `current` → v2: an exact retrain without the deleted samples: nothing owed"


def test_the_batch_description_prints_the_serve_line_as_plain_text():
    """The command prints the receipt the flow's result carries (nothing read back from disk); the
    serialised result names the receipt's file, as it always did."""
    from cli.common import describe_batch
    from flows.results import AttemptLine, ProcessResult, Timings

    interim = receipt(promoted=True, forgetting="interim")
    result = ProcessResult(
        scenario="mnist5k-hfl", resumed=[], quarantined=[], already_applied=[], left_pending=[], waiting={},
        status="ok", batch_id=interim.batch_id, method="puf-special", certificate="empirical only", promoted=True,
        attempts=[AttemptLine(attempt=0, method="puf-special", verdict="inconclusive", interim=True)],
        models=dict(interim.models), receipt=f"data/receipts/{interim.batch_id}.json", receipt_written=interim,
        forgetting="interim", exact_due=DUE.isoformat(), retrain_debt="retrain debt: 1 request(s)",
        exact_run="not scheduled",
        timings=Timings(flow_seconds=10, core_seconds=8, orchestration_seconds=2, orchestration_share=0.2))
    lines = describe_batch(result).splitlines()
    assert lines[1] == ("alias current -> v2 (puf-special, empirical only): serves on the interim tier — no check "
                        "failed (mia_auc_excess, forget_audit inconclusive); exact forgetting due by 2026-12-27 07:42Z")
    assert lines[2] == "exact retrain: not scheduled" and "**" not in "\n".join(lines)
    dumped = json.loads(result.model_dump_json())
    assert dumped["forgetting"] == "interim" and dumped["receipt"] == f"data/receipts/{interim.batch_id}.json"
    assert "receipt_written" not in dumped  # the flow result's keys are unchanged


def test_an_interim_version_shows_the_reading_that_decided_never_a_strict_fail_beside_no_check_failed():
    """The strict one-sided audit said `fail`; the interim tier read it as equivalence (pass) and per
    sample (pass) and served: the verdict line, the serve line and the gate table all show the interim
    reading; a strict batch keeps showing its own."""
    checks = [gate("test_acc_drop_vs_source", "pass"), gate("forget_audit", "fail")]
    interim_reading = {"audit_equivalence": gate("forget_audit_equivalence", "pass"),
                       "per_sample": gate("forget_audit_per_sample", "pass"), "interim": True}
    outcome = GateOutcome.of("without reference", checks).model_copy(update=interim_reading)
    served = receipt(promoted=True, forgetting="interim").model_copy(update={"gates": outcome, "policy": "interim"})
    text = served.markdown()
    assert "interim reading: **may serve**" in text and "**fail**" not in text and "FAIL" not in text
    assert served.serve_line().startswith("alias `current` → v2: serves on the **interim** tier — every check passed")
    table = [line for line in text.splitlines() if line.startswith("| forget_audit")]
    assert len(table) == 2 and all("| pass |" in line for line in table), table  # equivalence, then per sample
    strict = served.model_copy(update={"forgetting": "exact", "policy": "strict"})
    assert "gates (without reference) **fail**" in strict.markdown()


def test_the_attempts_line_names_the_interim_reading_beside_the_strict_verdict():
    """An attempt the interim tier served though its strict verdict failed reads `interim: serves;
    strict: fail` — never a bare `fail` above a line saying it serves; a strict batch shows its own."""
    from flows.results import AttemptLine

    served = AttemptLine(attempt=0, method="fedquit", verdict="fail", interim=True)
    held = AttemptLine(attempt=1, method="puf-special", verdict="inconclusive", interim=False)
    assert served.reading(interim_tier=True) == "interim: serves; strict: fail"
    assert held.reading(interim_tier=True) == "interim: held back; strict: inconclusive"
    assert served.reading(interim_tier=False) == "fail"
    assert AttemptLine(attempt=2, method="retrain", note="exact").reading(interim_tier=True) == "exact"
