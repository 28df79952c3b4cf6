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


def refused(tmp_path, *args: str) -> str:
    """The command's one error line, once it exited 2 having made nothing (no Prefect home, no store)."""
    from pathlib import Path

    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    done = subprocess.run([sys.executable, "-m", "cli", "--root", str(tmp_path), *args], capture_output=True, text=True)
    assert done.returncode == 2, (args, done.stderr)
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    return done.stderr


def test_an_unknown_method_is_refused_in_one_line_naming_the_methods_of_the_setting(tmp_path):
    line = refused(tmp_path, "process", "--scenario", "digits-hfl", "--method", "puf-speshul")
    assert "unknown method 'puf-speshul'" in line and "auto, fedquit, finetune, ga, hf-kcu" in line
    line = refused(tmp_path, "process", "--scenario", "digits-hfl", "--method", "fedora")
    assert "method 'fedora' does not unlearn in hfl" in line and "puf-special" in line


def test_every_command_checks_its_methods_request_and_scenario_first(tmp_path, capsys):
    """In-process (a subprocess each would cost an interpreter's start): exit 2, one error line, nothing made
    in the workspace (no store, no DVC repository)."""
    from pathlib import Path

    from cli import main

    (tmp_path / "params.yaml").write_text((Path(__file__).resolve().parents[1] / "params.yaml").read_text())

    def error_line(*args: str) -> str:
        assert main(["--root", str(tmp_path), *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"], err
        return err

    hfl = ["--scenario", "digits-hfl"]
    assert "'nope' is not a method for digits-hfl (hfl)" in error_line("benchmark", *hfl, "--request", "client:0",
                                                                         "--methods", "ga,nope")
    assert "cannot parse request 'clients:0'" in error_line("benchmark", *hfl, "--request", "clients:0")
    assert "cannot parse request 'clients:0'" in error_line("train", *hfl, "--backdoor", "--request", "clients:0")
    for command in (["benchmark", "--request", "client:0"], ["train"], ["ingest"], ["demo"], ["compare"], ["ids"],
                    ["prepare"], ["serve"]):
        assert "unknown scenario 'nope'" in error_line(*command, "--scenario", "nope")


def test_argparse_refuses_an_unknown_flag_or_choice_with_its_usage_line_and_exit_2(tmp_path):
    for args in (["process", "--methd", "ga"], ["process", "--runner", "spark"],
                 ["process", "--forgetting-policy", "lenient"]):
        done = subprocess.run([sys.executable, "-m", "cli", "--root", str(tmp_path), *args], capture_output=True,
                              text=True)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and lines[0].startswith("usage: fedunlearn") and "error:" in lines[-1], lines
    assert list(tmp_path.iterdir()) == []


def test_the_methods_the_cli_checks_are_the_registered_ones():
    from fedunlearn.method_choice import METHOD_SETTINGS
    from fedunlearn.unlearning import available_methods

    assert {name: sorted(settings) for name, settings in METHOD_SETTINGS.items()} == {
        name: sorted(s for s in ("dfl", "hfl", "vfl") if name in available_methods(setting=s))
        for name in available_methods()}
