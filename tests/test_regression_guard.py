"""``fedunlearn benchmark --compare OLD.json``: the comparison rules on hand-made rows, then the
CLI on a real (tiny) benchmark run against a baseline it cannot match."""

import json

import pytest

from fedunlearn.benchmark.regression import compare, load_baseline
from cli import main

SCENARIO, REQUEST = "breast_cancer-dfl-ring", "samples:0.1@all"


def row(method: str, **values) -> dict:
    base = {"method": method, "scenario": SCENARIO, "request": REQUEST, "abs_gap_forget_acc": 0.01,
            "abs_gap_mia_auc": 0.01, "abs_gap_bd_asr": None, "abs_gap_test_acc": 0.01, "speedup_vs_retrain": 20.0,
            "certificate": "formal (ε,δ)"}
    return {**base, **values}


def verdicts(comparison) -> dict[tuple[str, str], str]:
    return {(f.method, f.check): f.verdict for f in comparison.findings}


def test_within_tolerance_is_no_regression_and_reference_rows_are_not_judged():
    baseline = [row("original", speedup_vs_retrain=None), row("retrain", speedup_vs_retrain=1.0), row("m")]
    current = [row("original", abs_gap_forget_acc=0.9), row("retrain"),
               row("m", abs_gap_forget_acc=0.029, speedup_vs_retrain=15.1)]
    result = compare(current, baseline)
    assert not result.regressions and {f.method for f in result.findings} == {"m"}
    assert ("m", "abs_gap_bd_asr") not in verdicts(result)  # the baseline never measured it


def test_worse_forgetting_slower_weaker_certificate_or_missing_method_are_flagged():
    baseline = [row("retrain"), row("gap"), row("slow"), row("weaker"), row("gone")]
    current = [row("retrain"), row("gap", abs_gap_mia_auc=0.05), row("slow", speedup_vs_retrain=14.9),
               row("weaker", certificate="not certified")]
    flagged = {(f.method, f.check) for f in compare(current, baseline).regressions}
    assert flagged == {("gap", "abs_gap_mia_auc"), ("slow", "speedup_vs_retrain"), ("weaker", "certificate"),
                       ("gone", "present")}
    tight = compare([row("m", speedup_vs_retrain=19.0)], [row("m")], speed_tolerance=0.0)
    assert [f.check for f in tight.regressions] == ["speedup_vs_retrain"]


def test_a_baseline_of_another_run_or_not_a_results_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="compare runs of the same scenario and request"):
        compare([row("m")], [row("m", request="class:0")])
    bad = tmp_path / "results.json"
    bad.write_text('{"method": "m"}')
    with pytest.raises(ValueError, match="not a benchmark results.json"):
        load_baseline(bad)
    with pytest.raises(ValueError, match="not found"):
        load_baseline(tmp_path / "missing.json")


@pytest.mark.reliability  # slow end to end: `make reliability`
def test_the_cli_flags_a_regression_with_exit_status_3_and_writes_the_comparison(workspace, prefect_server,
                                                                                  tmp_path, capsys):
    out = tmp_path / "bench"
    impossible = tmp_path / "baseline.json"  # a stored run no real run can match: 10^9× faster than retrain
    impossible.write_text(json.dumps([row("retrain"), row("certified-dfu", speedup_vs_retrain=1e9,
                                                          abs_gap_forget_acc=0.0, abs_gap_test_acc=0.0,
                                                          abs_gap_mia_auc=0.0)]))
    args = ["--root", str(workspace), "benchmark", "--scenario", SCENARIO, "--request", REQUEST,
            "--methods", "certified-dfu", "--out", str(out), "--compare", str(impossible)]
    assert main(args) == 8
    printed = capsys.readouterr().out
    assert "| certified-dfu | speedup_vs_retrain | 1e+09 |" in printed and "regression(s)" in printed
    saved = json.loads((out / "comparison.json").read_text())
    assert saved["regressions"] >= 1 and saved["scenario"] == SCENARIO
    assert {"method": "certified-dfu", "check": "certificate", "baseline": "formal (ε,δ)",
            "current": "formal (ε,δ)", "verdict": "ok"} in saved["findings"]
    # Against its own results the run passes.
    assert main([*args[:-1], str(out / "results.json"), "--speed-tolerance", "0.9"]) == 0
