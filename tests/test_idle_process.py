"""`fedunlearn process` with nothing to do answers from the files alone, before Prefect, MLflow and
torch are imported (``fedunlearn.requests.idle``); anything that may need the full run takes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from fedunlearn.requests.folders import RECEIPTS_DIR, RequestFolders
from fedunlearn.requests.idle import nothing_to_process

SCENARIO = "digits-hfl"


def journal(root: Path, batch_id: str, scenario: str = SCENARIO, status: str = "complete",
            finished: bool = True) -> None:
    folders = RequestFolders.create(root)
    (folders.batches / f"{batch_id}.json").write_text(json.dumps({
        "batch_id": batch_id, "scenario": scenario, "status": status,
        "finished_at": "2026-11-28T00:00:00Z" if finished else None}))


def receipt(root: Path, batch_id: str, forgetting: str | None = "interim", repaid: bool = False,
            scenario: str = SCENARIO) -> None:
    (root / RECEIPTS_DIR).mkdir(parents=True, exist_ok=True)
    (root / RECEIPTS_DIR / f"{batch_id}.json").write_text(json.dumps({
        "batch_id": batch_id, "scenario": scenario, "forgetting": forgetting, "outcome": "unlearned",
        "exactly_forgotten": {"at": "2026-11-29T00:00:00Z"} if repaid else None}))


def test_a_workspace_whose_batches_are_all_done_and_repaid_has_nothing_to_process(tmp_path):
    RequestFolders.create(tmp_path)
    assert nothing_to_process(tmp_path, SCENARIO)
    journal(tmp_path, "b1")
    receipt(tmp_path, "b1", repaid=True)
    journal(tmp_path, "b2")
    receipt(tmp_path, "b2", forgetting="exact")
    journal(tmp_path, "b3", scenario="other-hfl", finished=False)  # another scenario's end steps: not ours
    assert nothing_to_process(tmp_path, SCENARIO)


@pytest.mark.parametrize("left", ["a request in the inbox", "a batch being staged", "a batch not complete",
                                  "end steps not done", "no receipt", "an exact retrain owed",
                                  "a receipt from before the tiers", "the lock held", "a damaged record"])
def test_anything_left_to_do_or_in_doubt_takes_the_full_run(tmp_path, left):
    folders = RequestFolders.create(tmp_path)
    journal(tmp_path, "b1")
    receipt(tmp_path, "b1", repaid=True)
    if left == "a request in the inbox":
        (folders.inbox / "req-1.json").write_text("{}")
    elif left == "a batch being staged":
        (folders.staging / "req-1.json").write_text("{}")
    elif left == "a batch not complete":
        journal(tmp_path, "b2", scenario="other-hfl", status="versioned")
    elif left == "end steps not done":
        journal(tmp_path, "b1", finished=False)
    elif left == "no receipt":
        journal(tmp_path, "b2")
    elif left == "an exact retrain owed":
        receipt(tmp_path, "b1")
    elif left == "a receipt from before the tiers":
        receipt(tmp_path, "b1", forgetting=None)
    elif left == "a damaged record":
        (folders.batches / "b9.json").write_text("{not json")
    if left == "the lock held":
        with FileLock(folders.lock):
            assert not nothing_to_process(tmp_path, SCENARIO)
    else:
        assert not nothing_to_process(tmp_path, SCENARIO)


def test_the_command_answers_without_importing_prefect_mlflow_or_torch(workspace):
    code = ("import sys; from cli import main; status = main(['--root', sys.argv[1], 'process', '--scenario', "
            f"{SCENARIO!r}]); print(sorted(m for m in ('prefect', 'mlflow', 'torch') if m in sys.modules)); "
            "sys.exit(status)")
    ran = subprocess.run([sys.executable, "-c", code, str(workspace)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "no pending requests\n[]\n", ran.stdout


def test_the_loser_of_the_lock_names_the_batch_the_run_it_waited_for_formed(tmp_path, capsys):
    import threading
    import time

    from cli.common import print_summary
    from fedunlearn.requests.folders import batch_lock
    from flows.process import waited_for_batch
    from flows.results import ProcessResult

    folders = RequestFolders.create(tmp_path)
    holding = threading.Event()

    def winner() -> None:
        with batch_lock(folders, rerun=f"fedunlearn process --scenario {SCENARIO}") as held:
            held.note_batch("batch-20261128T000000Z-winner", SCENARIO)
            holding.set()
            time.sleep(0.5)

    thread = threading.Thread(target=winner)
    thread.start()
    holding.wait(10)
    with batch_lock(folders, timeout=10, rerun="fedunlearn process") as held:
        pass
    thread.join()
    assert held.waited and held.previous["batch_id"] == "batch-20261128T000000Z-winner"
    with batch_lock(folders) as free:  # nobody held it: nothing to name
        assert not free.waited and waited_for_batch(free, SCENARIO) is None
    print_summary(ProcessResult(scenario=SCENARIO, resumed=[], quarantined=[], already_applied=[], left_pending=[],
                                waiting={}, status="no pending requests",
                                forgotten_by=waited_for_batch(held, SCENARIO)))
    assert capsys.readouterr().out == (
        "the pending requests were taken by batch batch-20261128T000000Z-winner (formed by `fedunlearn process "
        f"--scenario {SCENARIO}`, which held the batch lock) while this run waited for it\nno pending requests\n")
