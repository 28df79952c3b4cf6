"""The demo as a user runs it (issue 37's acceptance: "the demo prints no library INFO line by
default"): `fedunlearn demo` in a fresh workspace, its own process and Prefect server, on the tiny
digits-hfl scenario. Each long step is announced with the scenario's numbers before it runs; the
story's lines are all there is. With --verbose the libraries' logs come back, and the note that the
"View at" links die with the command's own server. Minutes on 2 cores: `make reliability` only
(tests/test_cli_output.py checks the same settings in a few seconds)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli import QUIET_SETTINGS
from fedunlearn.config import load_params

FULL = os.environ.get("RELIABILITY_FULL") == "1"
pytestmark = pytest.mark.skipif(not FULL, reason="runs the whole demo in a fresh process: make reliability")

SCENARIO = "digits-hfl"
LIBRARY_LINES = ("INFO", "View at", "DeprecationWarning", "py.warnings", "Created temporary directory",
                 "Creating initial MLflow database tables")


def fedunlearn(workspace, *args: str) -> subprocess.CompletedProcess:
    """The command as a user starts it: none of the test session's Prefect or MLflow settings."""
    env = {k: v for k, v in os.environ.items() if k not in {*QUIET_SETTINGS, "PREFECT_API_URL", "PREFECT_HOME",
                                                            "MLFLOW_TRACKING_URI"}}
    return subprocess.run([sys.executable, "-m", "cli", "--root", str(workspace), *args], capture_output=True,
                          text=True, env=env, timeout=1800)


def test_the_demo_announces_each_long_step_and_prints_no_library_line(workspace):
    done = fedunlearn(workspace, "demo", "--scenario", SCENARIO)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    assert [line for line in printed.splitlines() if any(s in line for s in LIBRARY_LINES)] == [], printed
    cfg = load_params(workspace / "params.yaml").scenario(SCENARIO)
    rounds = f"{cfg.train.rounds} FedAvg rounds on {cfg.partition.num_clients} clients"
    assert f"== 1. training {SCENARIO} from scratch: {rounds}" in done.stdout
    assert "== 3. one deletion batch forgets them" in done.stdout
    assert f"== 5. exact retrain from scratch without the deleted samples ({rounds}, as long as step 1" \
        in done.stdout
    assert all(f"== {step}." in done.stdout for step in range(1, 7))
    assert "round 1/" not in done.stdout and "**" not in printed  # the library's round lines: --verbose only
    progress = [line for line in done.stderr.splitlines() if line.startswith("  … ")]  # ours, on stderr
    assert f"  … training {SCENARIO}: round 1/{cfg.train.rounds}" in "\n".join(progress), done.stderr
    ours = done.stdout.split("== 4.")[0] + done.stdout.split("== 5.")[1]  # step 4 is `status`'s own table
    assert "batch batch-" not in ours and "batch-" in ours
    served = next(line for line in done.stdout.splitlines() if "alias current -> v" in line and "serves" in line)
    assert "interim tier" in served and "exact forgetting due by" in served, served
    print(f"the demo printed {len(printed.splitlines())} lines")


def test_verbose_brings_the_libraries_logs_back_and_says_where_the_links_point(workspace):
    done = fedunlearn(workspace, "train", "--scenario", SCENARIO, "--rounds", "1", "--inline", "--verbose")
    assert done.returncode == 0, done.stderr
    assert "Beginning flow run" in done.stderr and "View at http://127.0.0.1:" in done.stderr
    assert "round 1/1" in done.stderr and "stops when the command ends" in done.stderr
