"""`fedunlearn status` names what needs a person (issue 37): the requests a batch quarantined, with
their reasons (never the sample IDs those quote, escaped for markdown) and what to do; and the next
exact retrain Prefect has scheduled for the retrain debt, or what to run when none is."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import quarantine, read_quarantined, scan_inbox, submit_request
from fedunlearn.requests.model import build_request
from tasks.status_lines import (QuarantineLine, ScheduledRetrain, markdown_text, next_retrain_line,
                                quarantine_lines, runs_for, without_sample_ids)

SCENARIO = "digits-hfl"
AT = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)
IDS = ["digits-0001", "digits-0002", "digits-0003"]
# What tasks.validation writes for a sample request naming deleted IDs (the ledger's) and live ones.
DELETED_REASON = ("already deleted (listed in data/ledger/ledger.jsonl): digits-0001, digits-0002; its other 1 ID(s) "
                  "are live and stay in the data, since a request is applied whole or not at all: digits-0003. To "
                  "delete them, submit a new request naming only those IDs")


def test_a_reason_shows_no_sample_id_and_no_value_quoted_from_a_file():
    shown = without_sample_ids(DELETED_REASON, IDS)
    assert not any(i in shown for i in IDS)
    assert shown.startswith("already deleted (listed in data/ledger/ledger.jsonl): (2 sample IDs); its other 1 ID(s)")
    assert "whole or not at all: (1 sample ID). To delete them" in shown
    catalog = without_sample_ids(f"2 sample ID(s) are not in the current data, e.g. {IDS[:2]!r}", IDS)
    assert catalog == "2 sample ID(s) are not in the current data, e.g. (2 sample IDs)"
    parse = without_sample_ids("sample_ids.0: String should have at most 5 characters (got 'digits-0009')", [])
    assert "digits-0009" not in parse and parse.endswith("(the value is in the file)")


def test_a_reason_is_escaped_for_markdown_on_one_bounded_line():
    text = markdown_text("a | b *c* `d` [e](f) <script>\nnext line " + "x" * 500)
    assert "\n" not in text and len(text) < 300 and text.endswith("…")
    assert text.startswith(r"a \| b \*c\* \`d\` \[e\](f) \<script\> next line")


def quarantine_examples(root: Path) -> list[str]:
    """The inbox after a batch: a sample request refused for deleted IDs, a malformed file (both
    quarantined as a batch does); returns the sample IDs they name."""
    folders = RequestFolders.create(root)
    refused = submit_request(folders, build_request({"kind": "sample", "scenario": SCENARIO, "sample_ids": IDS}))
    (folders.inbox / "broken.json").write_text('{"kind": "sample", "sample_ids": ["digits-0009"], "deadline": "soon"}')
    for item in scan_inbox(folders, SCENARIO):
        if item.name in (refused.name, "broken.json"):
            quarantine(folders, item, DELETED_REASON if item.request else item.problem)
    return [*IDS, "digits-0009"]


def test_quarantined_files_are_read_back_latest_first_with_their_request_and_reason(tmp_path):
    quarantine_examples(tmp_path)
    found = read_quarantined(RequestFolders(tmp_path))
    assert len(found) == 2 and [q.at for q in found] == sorted((q.at for q in found), reverse=True)
    by_name = {q.name: q for q in found}
    assert by_name["broken.json"].request_id is None and "deadline" in by_name["broken.json"].reason
    assert [q.reason for q in found if q.request_id] == [DELETED_REASON]


def test_the_quarantine_listing_is_bounded_and_counts_every_file():
    shown = [QuarantineLine(f"req-{n}", f"req-{n}.json", AT, "why") for n in range(5)]
    lines = quarantine_lines(shown, 12)
    assert "**12 quarantined request(s)**, never applied (the latest 5 listed)" in lines[1]
    assert sum(line.startswith("| req-") for line in lines) == 5


def test_a_scheduled_retrain_is_named_by_its_time_and_deployment():
    scheduled = ScheduledRetrain("repay-retrain-debt/weekly", AT)
    assert (next_retrain_line(scheduled, SCENARIO, AT + timedelta(days=1))
            == "next exact retrain: 2026-12-01 03:00Z (repay-retrain-debt/weekly)")
    late = next_retrain_line(scheduled, SCENARIO, AT - timedelta(hours=1))
    assert "after the latest safe start 2026-12-01 02:00Z" in late and "fedunlearn repay-debt" in late


@pytest.mark.parametrize("scheduled, why", [
    (ScheduledRetrain(), "no server serves repay-retrain-debt"),
    (ScheduledRetrain("repay-retrain-debt/weekly", AT, paused=True), "is paused"),
    (ScheduledRetrain("repay-retrain-debt/weekly"), "is served but has no run scheduled for digits-hfl"),
    (ScheduledRetrain(unknown="PREFECT_API_URL is not set"), "PREFECT_API_URL is not set")])
def test_without_a_scheduled_retrain_status_says_what_to_run(scheduled, why):
    line = next_retrain_line(scheduled, SCENARIO, AT)
    assert line.startswith("next exact retrain: none scheduled (") and why in line
    assert f"run `fedunlearn repay-debt --scenario {SCENARIO}` before 2026-12-01 03:00Z" in line


def test_only_runs_for_this_workspace_and_scenario_count(tmp_path):
    assert runs_for({"scenario": SCENARIO, "root": str(tmp_path)}, tmp_path, SCENARIO)
    assert runs_for({"scenario": SCENARIO}, tmp_path, SCENARIO)  # the deployment's default root
    assert not runs_for({"scenario": SCENARIO, "root": str(tmp_path / "other")}, tmp_path, SCENARIO)
    assert not runs_for({"scenario": "mnist5k-hfl", "root": str(tmp_path)}, tmp_path, SCENARIO)


def test_status_asks_the_prefect_server_for_the_next_scheduled_exact_retrain(prefect_server, tmp_path):
    """A served repay-retrain-debt deployment with runs scheduled for several workspaces and scenarios:
    the earliest of this workspace's scenario is the one named; with none served, none is."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    from tasks.debt import REPAY_DEPLOYMENT

    @flow(name=REPAY_DEPLOYMENT.split("/")[0])
    def repay_retrain_debt(scenario: str, root: str) -> None:  # its name is what the deployment is found by
        pass

    from tasks.status import scheduled_retrain

    assert scheduled_retrain(tmp_path, SCENARIO) == ScheduledRetrain()  # nothing served
    soon = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=3)
    with get_client(sync_client=True) as client:
        deployment = client.create_deployment(flow_id=client.create_flow(repay_retrain_debt),
                                              name=REPAY_DEPLOYMENT.split("/")[1], entrypoint="flows/debt.py:x")
        try:
            for hours, parameters in ((0, {"scenario": "mnist5k-hfl", "root": str(tmp_path)}),
                                      (1, {"scenario": SCENARIO, "root": str(tmp_path / "another")}),
                                      (5, {"scenario": SCENARIO, "root": str(tmp_path)}),
                                      (2, {"scenario": SCENARIO, "root": str(tmp_path)})):
                client.create_flow_run_from_deployment(deployment, parameters=parameters,
                                                       state=Scheduled(scheduled_time=soon + timedelta(hours=hours)))
            found = scheduled_retrain(tmp_path, SCENARIO)
        finally:  # the session's server is shared: no other test should find this deployment
            client.delete_deployment(deployment)
    assert found == ScheduledRetrain(REPAY_DEPLOYMENT, soon + timedelta(hours=2))
    assert next_retrain_line(found, SCENARIO, None).startswith(
        f"next exact retrain: {soon + timedelta(hours=2):%Y-%m-%d %H:%M}Z (repay-retrain-debt/weekly)")


def test_without_a_prefect_server_set_status_asks_none(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.status import scheduled_retrain

    with temporary_settings(updates={PREFECT_API_URL: None}):
        found = scheduled_retrain(tmp_path, SCENARIO)
    assert found.deployment is None and "PREFECT_API_URL is not set" in found.unknown
