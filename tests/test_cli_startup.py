"""`fedunlearn --help` and the parser it builds load no torch, Prefect or MLflow: they take seconds
to import, and a user reading the help should not wait for them (issue 37, "input checked late")."""

import subprocess
import sys


def test_the_parser_and_help_load_no_torch_prefect_or_mlflow():
    probe = ("import sys; from cli import build_parser; build_parser().format_help(); "
             "print(sorted(m for m in ('torch', 'prefect', 'mlflow') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded


def test_help_still_lists_every_command():
    printed = subprocess.run([sys.executable, "-m", "cli", "--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: fedunlearn" in printed and "process" in printed and "verify-receipt" in printed


def test_an_unknown_scenario_is_refused_in_one_line_before_any_flow_starts(tmp_path):
    from pathlib import Path

    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    for command in ("process", "retrain", "repay-debt"):
        done = subprocess.run([sys.executable, "-m", "cli", "--root", str(tmp_path), command, "--scenario", "nope"],
                              capture_output=True, text=True)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "unknown scenario 'nope'" in done.stderr
        assert "digits-hfl" in done.stderr  # names the scenarios there are
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no Prefect home, no store was made
