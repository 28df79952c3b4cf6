"""The pipeline on the Flower engines (issue 38 item 3), as a new user runs it: `fedunlearn train
--scenario digits-hfl --runner flower`, a sample request, `fedunlearn process --runner flower`; the
simulation engine the same way; HF-KCU as the batch's method. Each test starts Flower federations (a
SuperLink and three SuperNodes, or a Ray cluster) two to four times, minutes in all:
``make reliability`` only.

Checked: the original and the serving interim version carry the ``runtime`` tag of the engine that
computed them, and a Flower-trained run has its per-round metrics and its cost; a SuperNode really
killed mid-round (``FEDUNLEARN_FLOWER_FAULT``) ends the command with exit status 1 and an error naming
the node, registers nothing, moves no alias and writes no receipt, and the next run completes the
batch once; the default escalation runs on Flower with no fallback left to warn of; no Flower process
is left after any command, nor a minute after `fedunlearn process --runner flower` is SIGKILLed
mid-round (issue 51: the deployment's processes are under the lifeline's guard).
"""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient

from batch_harness import check_exactly_once, prefect_server as harness_server, submit, wait_for, workspace_copy
from cli.data import sample_ids
from fedunlearn.receipts import read_receipts
from fedunlearn_flower.deployment import FAULT_VARIABLE
from stores.registry import tracking_uri
from workspaces import call_cli

SCENARIO = "digits-hfl"
FULL = os.environ.get("RELIABILITY_FULL") == "1"

pytestmark = pytest.mark.skipif(not FULL, reason="starts Flower deployments: make reliability")


def registry(workspace) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking_uri(workspace), registry_uri=tracking_uri(workspace))


def versions(workspace) -> list:
    return registry(workspace).search_model_versions(f"name='{SCENARIO}'")


def aliases(workspace) -> dict[str, str]:
    return dict(registry(workspace).get_registered_model(SCENARIO).aliases)


def flower_processes(workspace: Path, grace: float = 0.0) -> list[str]:
    """Live processes of Flower's runs in ``workspace``, once ``grace`` seconds have passed: the
    deployment's (SuperLink, SuperNodes, SuperExec, ServerApp, ClientApps — orphans too, as a killed
    SuperNode's ClientApp is no descendant of this process any more), found by the FLWR_HOME they
    run under, in the workspace's temporary directory; and this process's descendants that are
    Ray's or Flower's (the simulation engine)."""
    root, deadline = str(Path(workspace).resolve()), time.monotonic() + grace
    while True:
        found, children = [], {child.pid for child in psutil.Process().children(recursive=True)}
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                    continue
                command = " ".join(proc.info["cmdline"] or [])
                ours = proc.environ().get("FLWR_HOME", "").startswith(root)
                child = proc.pid in children and is_flower_or_ray(proc.info["cmdline"] or [])
            except psutil.Error:
                continue
            if ours or child:
                found.append(f"{proc.pid} {command}")
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def is_flower_or_ray(cmdline: list[str]) -> bool:
    """Flower's programs (flower-superlink, flwr-clientapp, ...) or Ray's (raylet, gcs_server, its
    Python agents and workers), told by the program's name, not by a path that may contain one."""
    names = [Path(arg).name for arg in cmdline[:3]]
    return (any(name.startswith(("flower-", "flwr-", "ray::", "raylet", "gcs_server")) for name in names)
            or any("ray" in Path(arg).parts[-4:-1] for arg in cmdline[:3]))


def assert_flower_trained(workspace, version, runtime: str) -> None:
    """``version`` was trained through Flower: its tag, its per-round metrics (test_acc and
    train_loss at steps 1..R, as the in-process trainer logs them) and its cost (FLOPs, bytes)."""
    assert version.tags["runtime"] == runtime and version.tags["role"] == "original"
    client, run = registry(workspace), registry(workspace).get_run(version.run_id)
    rounds = int(run.data.params["train.rounds"])
    for key in ("test_acc", "train_loss"):
        history = client.get_metric_history(version.run_id, key)
        assert [m.step for m in history] == list(range(1, rounds + 1)), key
        assert all(math.isfinite(m.value) for m in history), key
    assert run.data.metrics["flops"] > 0 and run.data.metrics["comm_bytes"] > 0


def request_samples(workspace, client: int = 1, count: int = 10) -> None:
    ids = sample_ids(workspace, SCENARIO, client)[:count]
    assert call_cli(workspace, "request", "samples", "--scenario", SCENARIO, "--ids", *ids).status == 0


def assert_current_from_flower(workspace, runtime: str, method: str | None = None) -> None:
    """``current`` is the batch's unlearned version, computed on ``runtime``, with its receipt."""
    [receipt] = read_receipts(workspace, SCENARIO)
    current = registry(workspace).get_model_version_by_alias(SCENARIO, "current")
    assert current.tags["runtime"] == runtime and current.tags["role"] == "unlearned"
    assert current.tags["batch_id"] == receipt.batch_id and receipt.promoted
    assert str(receipt.models["unlearned"].version) == str(current.version)
    if method is not None:
        assert receipt.method == method


def test_train_request_process_through_flower_and_a_killed_supernode_resumes_once(workspace, prefect_server,
                                                                                 monkeypatch):
    trained = call_cli(workspace, "train", "--scenario", SCENARIO, "--runner", "flower")
    assert trained.status == 0, trained.err
    [original] = versions(workspace)
    assert_flower_trained(workspace, original, "flower-deployment")
    assert flower_processes(workspace) == []

    request_samples(workspace)
    before = aliases(workspace)
    with monkeypatch.context() as patch:
        # SuperNode 1 holds the samples to forget: PUF's unlearning round is its first message after connect.
        patch.setenv(FAULT_VARIABLE, "kill-supernode:1")
        failed = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower")
    assert failed.status == 1, failed.out + failed.err
    assert "SuperNode 1 (pid" in failed.err and "exited with status -9 mid-run: client 1 is gone" in failed.err
    assert [v.version for v in versions(workspace)] == [original.version]  # nothing registered for the attempt
    assert aliases(workspace) == before
    assert read_receipts(workspace, SCENARIO) == []
    assert flower_processes(workspace, grace=5.0) == []

    done = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower")
    assert done.status == 0, done.err
    # A sample batch's default chain — PUF-Special, stronger, PUF-Regular, FedQUIT, retrain — runs on Flower
    # up to the exact retrain: no fallback runs in-process, so there is nothing to warn of.
    assert "no Flower version" not in done.out
    assert_current_from_flower(workspace, "flower-deployment")
    assert flower_processes(workspace, grace=5.0) == []
    again = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower")
    assert again.status == 0 and len(read_receipts(workspace, SCENARIO)) == 1


def test_train_and_process_on_the_simulation_engine(workspace, prefect_server):
    trained = call_cli(workspace, "train", "--scenario", SCENARIO, "--runner", "flower-simulation")
    assert trained.status == 0, trained.err
    [original] = versions(workspace)
    assert_flower_trained(workspace, original, "flower-simulation")

    request_samples(workspace)
    done = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower-simulation")
    assert done.status == 0, done.err
    assert_current_from_flower(workspace, "flower-simulation")
    assert flower_processes(workspace, grace=10.0) == []  # Ray's cluster shut down with each run


def test_hf_kcu_is_the_batch_method_on_the_flower_runner(workspace, prefect_server):
    """A model trained in-process, its batch forgotten by HF-KCU through the local deployment."""
    assert call_cli(workspace, "train", "--scenario", SCENARIO).status == 0
    request_samples(workspace)
    done = call_cli(workspace, "process", "--scenario", SCENARIO, "--runner", "flower", "--method", "hf-kcu")
    assert done.status == 0, done.err
    assert_current_from_flower(workspace, "flower-deployment", method="hf-kcu")
    assert flower_processes(workspace, grace=5.0) == []


def test_no_flower_process_outlives_a_killed_process_command(tmp_path, digits_hfl_template, reliability_report):
    """`fedunlearn process --runner flower` SIGKILLed once its deployment runs a round (ClientApps
    up): the SuperLink, the SuperNodes and all they started are gone a minute later, however the
    kernel ordered the deaths; the next run (in-process) finishes the batch exactly once."""
    with harness_server(tmp_path / "server") as api_url, workspace_copy(tmp_path, digits_hfl_template,
                                                                       api_url) as (cli, ids):
        requests = [submit(cli.workspace, ids.take(10))]
        run = cli.start("process", "--scenario", SCENARIO, "--runner", "flower")
        wait_for(lambda: any("flwr-clientapp" in p for p in flower_processes(cli.workspace)), [run])
        os.kill(run.process.pid, signal.SIGKILL)  # the command alone, as the OOM killer would
        killed = run.wait()  # nothing of its process group left within seconds
        assert killed.returncode == -signal.SIGKILL, killed.describe()
        assert flower_processes(cli.workspace, grace=60.0) == []
        reliability_report.count("Flower runs killed, no process left")
        resumed = cli.process()
        assert resumed.returncode == 0, resumed.describe()
        check_exactly_once(cli.workspace, requests)
