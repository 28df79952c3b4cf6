"""A user's own data end to end, as a new user runs it: a CSV (IDs ``pat-NNNNN``) and an image folder
declared with paths relative to the workspace, trained, a request by the file's own IDs processed,
the debt repaid — every step exits 0 and the source no longer holds the rows; or, the source being
the user's system of record, ``status`` names the rows to delete (exit 6) and turns clean once they
are deleted and ``rescan`` ran. And a diverged training is refused, naming the setting. Minutes on
a shared machine: ``make reliability``."""


import pytest

from user_data import CSV_PATH, IMAGES_PATH, csv_spec, declare, images_spec, write_csv, write_images
from workspaces import call_cli, status_row

pytestmark = pytest.mark.reliability


def ok(workspace, *args):
    printed = call_cli(workspace, *args)
    assert printed.status == 0, (args, printed.out[-2000:], printed.err[-2000:])
    return printed


@pytest.mark.parametrize("kind", ["csv", "images"])
def test_a_users_file_is_declared_trained_forgotten_and_erased(kind, workspace, prefect_server):
    if kind == "csv":
        write_csv(workspace)
        declare(workspace, "mine", csv_spec(), "mine-hfl")
        forget, gone = ["pat-00003", "pat-00010"], lambda: not any(i in (workspace / CSV_PATH).read_text()
                                                                    for i in ["pat-00003,", "pat-00010,"])
    else:
        write_images(workspace)
        declare(workspace, "mine", images_spec(), "mine-hfl")
        forget = ["0/img003.png", "2/img010.png"]
        gone = lambda: not any((workspace / IMAGES_PATH / i).exists() for i in forget)  # noqa: E731
    ok(workspace, "train", "--scenario", "mine-hfl", "--inline")
    request_id = ok(workspace, "request", "samples", "--scenario", "mine-hfl", "--ids", *forget).out.strip()
    processed = ok(workspace, "process", "--scenario", "mine-hfl")
    assert "erasure verified" in processed.out and "rewritten without its 2 deleted row(s)" in processed.out
    assert gone()
    ok(workspace, "repay-debt", "--scenario", "mine-hfl")
    status = ok(workspace, "status", "--scenario", "mine-hfl")
    assert "ERASURE PENDING" not in status.out and status_row(status.out, request_id)[1] == "exact"


def test_a_system_of_record_keeps_the_erasure_pending_until_the_user_deletes_and_rescans(workspace, prefect_server):
    path = write_csv(workspace)
    declare(workspace, "mine", csv_spec(system_of_record=True), "mine-hfl")
    ok(workspace, "train", "--scenario", "mine-hfl", "--inline")
    request_id = ok(workspace, "request", "samples", "--scenario", "mine-hfl", "--ids", "pat-00003",
                    "mine-pat-00010").out.strip()  # the form with the dataset's name in front is accepted too
    processed = ok(workspace, "process", "--scenario", "mine-hfl")
    assert "erasure PENDING at the source data/user/digits.csv" in processed.out
    ok(workspace, "repay-debt", "--scenario", "mine-hfl")
    status = call_cli(workspace, "status", "--scenario", "mine-hfl")
    assert status.status == 6 and "IDs pat-00003, pat-00010; line 5, line 12" in status.out
    assert status_row(status.out, request_id)[1:3] == ["erasure", "pending"], status.out
    assert "1 erasure pending" in status.out and "0 exact" in status.out
    assert call_cli(workspace, "rescan", "--scenario", "mine-hfl").status == 6
    text = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in text if not line.startswith(("pat-00003,", "pat-00010,"))))
    ok(workspace, "rescan", "--scenario", "mine-hfl")
    status = ok(workspace, "status", "--scenario", "mine-hfl")
    assert "ERASURE PENDING" not in status.out and status_row(status.out, request_id)[1] == "exact"


def test_a_diverged_training_is_refused_naming_the_setting(workspace, prefect_server):
    write_csv(workspace)
    declare(workspace, "mine", csv_spec(), "mine-hfl", lr=80.0)
    printed = call_cli(workspace, "train", "--scenario", "mine-hfl", "--inline")
    assert printed.status == 2 and "train.lr (now 80)" in printed.err, printed.err
