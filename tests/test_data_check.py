"""``fedunlearn check-data``: the data as the pipeline sees it, read from the source before anything
is prepared — rows, classes, clients, IDs, duplicates, outliers — and a training-time estimate."""

import yaml

from fedunlearn.config import load_params
from fedunlearn.data_check import check_data
from user_data import csv_spec, declare, write_csv
from workspaces import call_cli


def test_check_data_counts_a_users_csv_its_duplicates_and_its_outliers(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump({"prepare": [], "scenarios": {}}))
    path = write_csv(root, rows=200)
    lines = path.read_text().splitlines()
    lines.append(lines[5].replace("pat-00004", "dup-1"))  # a copy of a row under another ID
    lines.append("far-1," + ",".join(["16"] * 64) + ",0")  # nothing like any digit
    path.write_text("\n".join(lines) + "\n")
    declare(root, "clinic", csv_spec(), "clinic-hfl")
    report = check_data(load_params(root / "params.yaml"), "clinic-hfl", root)
    assert report.rows == 202 and len(report.classes) == 10 and sum(report.classes.values()) == 202
    assert report.id_source == "from column 'pid'" and report.duplicate_rows == 2
    assert report.held_out + sum(report.clients) == 202 and len(report.clients) == 3
    assert report.outliers[0] == "far-1" and report.train_seconds is not None and report.train_seconds > 0
    assert 0.09 < report.majority_rate < 0.2


def test_the_command_prints_the_summary_and_changes_nothing(tmp_path):
    root = tmp_path / "ws"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump({"prepare": [], "scenarios": {}}))
    write_csv(root, rows=120)
    declare(root, "clinic", csv_spec(), "clinic-hfl")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    printed = call_cli(root, "check-data", "--scenario", "clinic-hfl")
    assert printed.status == 0 and "120 rows" in printed.out and "training samples per client" in printed.out
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
