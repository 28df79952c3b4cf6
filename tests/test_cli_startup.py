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
