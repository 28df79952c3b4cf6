"""A full disk, for real (issue 26): a trained digits-hfl workspace on its own tmpfs — Prefect's home
(the CLI's default, inside the workspace) and MLflow's database on the same filesystem — filled until
2 MB, then 700 KB, are free. `fedunlearn process` must exit 7 saying "no space left on device" with a
path, leave no MLflow run RUNNING, and, once the space is freed, the same command must finish the
batch exactly once.

Mounting a tmpfs needs root (``mount -t tmpfs``): `make reliability` runs it, as root. A batch and a
training take minutes on 2 cores, so `make test` does not collect it (``RELIABILITY_FULL`` unset)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from batch_harness import (BIN, PROJECT_ROOT, RUN_TIMEOUT_S, SCENARIO, SampleIds, base_environment,
                           check_exactly_once, registry, submit)
from stores.workspace import init_workspace

FULL = os.environ.get("RELIABILITY_FULL") == "1"
FREE_LEFT = {"2 MB": 2 * 2**20, "700 KB": 700 * 2**10}
DISK_BYTES = 768 * 2**20


@contextmanager
def tmpfs(mount: Path, size: int) -> Iterator[Path]:
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave: int) -> Path:
    """A filler file taking all but ``leave`` bytes of the filesystem."""
    filler = mount / "filler"
    with open(filler, "wb") as out:
        os.posix_fallocate(out.fileno(), 0, shutil.disk_usage(mount).free - leave)
    assert abs(shutil.disk_usage(mount).free - leave) < 64 * 2**10
    return filler


def fedunlearn(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: Prefect's home and its Prefect server the workspace's own."""
    env = {k: v for k, v in base_environment(workspace.parent / "unused-prefect-home").items()
           if k not in ("PREFECT_HOME", "PREFECT_API_URL")}
    return subprocess.run([str(BIN / "fedunlearn"), "--root", str(workspace), *args], env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)


def running_runs(workspace: Path) -> list[str]:
    client = registry(workspace)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return [f"{run.info.run_name} ({run.info.run_id})"
            for run in client.search_runs(experiments, "attributes.status = 'RUNNING'")]


if FULL:
    def test_a_batch_on_a_full_disk_exits_7_with_a_path_and_resumes_exactly_once(tmp_path, reliability_report):
        with tmpfs(tmp_path / "disk", DISK_BYTES) as disk:
            workspace = init_workspace(disk / "workspace", template=PROJECT_ROOT)
            trained = fedunlearn(workspace, "train", "--scenario", SCENARIO, "--inline")
            assert trained.returncode == 0, trained.stderr[-4000:]
            sample_ids, submitted = SampleIds(workspace), []
            for name, leave in FREE_LEFT.items():
                submitted.append(submit(workspace, sample_ids.take(10)))
                filler = fill(disk, leave)
                failed = fedunlearn(workspace, "process", "--scenario", SCENARIO)
                err = failed.stderr
                assert failed.returncode == 7, f"{name} free: exit {failed.returncode}\n{err[-6000:]}"
                [line] = [line for line in err.splitlines() if line.startswith("error: ")] or [err[-6000:]]
                print(f"{name} free: {line}")
                assert "no space left on device (" in line and str(disk) in line, line
                assert re.search(r"run `fedunlearn (--root \S+ )?process --scenario digits-hfl` again", line), line
                # The CLI's own last word is the error (Prefect's flow-run log above it may show the traceback);
                # after it only Prefect's INFO lines, no crash of the command itself (the command's own
                # Prefect server, whose database the full disk also refuses, writes to .prefect/server.log).
                after = err.split(line, 1)[1].strip().splitlines()
                assert all(" | INFO " in rest for rest in after), err[-6000:]
                assert running_runs(workspace) == [], name
                filler.unlink()
                resumed = fedunlearn(workspace, "process", "--scenario", SCENARIO)
                assert resumed.returncode == 0, resumed.stderr[-6000:]
                check_exactly_once(workspace, submitted)
                reliability_report.count("full disks reported (exit 7) and resumed exactly once")
            again = fedunlearn(workspace, "process", "--scenario", SCENARIO)
            assert again.returncode == 0 and again.stdout.strip().endswith("no pending requests"), again.stdout
