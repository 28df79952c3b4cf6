"""Request events and `fedunlearn status`, without a batch: what the inbox watcher announces for a
request file (scenario, urgency from its deadline), the deployment triggers built from params.yaml,
and the status of pending requests — overdue first, exit status 9 for monitors."""

import json
from datetime import timedelta

import pytest

import runtime.events as events
from cli import main
from fedunlearn.config import RequestsConfig
from fedunlearn.errors import RequestOverdue
from fedunlearn.requests.model import CLOCK_VARIABLE, utc_now

SCENARIO = "digits-hfl"


@pytest.fixture
def emitted(monkeypatch) -> list[dict]:
    calls = []
    monkeypatch.setattr(events, "emit_event", lambda event, **kwargs: calls.append({"event": event, **kwargs}))
    return calls


def test_a_request_file_is_announced_with_its_scenario_and_urgency(tmp_path, emitted):
    soon, later = utc_now() + timedelta(hours=5), utc_now() + timedelta(days=20)
    (tmp_path / "req-soon.json").write_text(json.dumps({"scenario": "wine-vfl", "deadline": soon.isoformat()}))
    (tmp_path / "req-later.json").write_text(json.dumps({"request_id": "req-later", "deadline": later.isoformat()}))
    (tmp_path / "req-broken.json").write_text("{not json")  # still announced: its validation is the batch's job
    (tmp_path / ".hidden.json").write_text("{}")
    announced = [events.announce_file(p, SCENARIO, 30, 72) for p in sorted(tmp_path.iterdir())]
    assert announced == [False, True, True, True]
    by_id = {call["resource"]["prefect.resource.name"]: call for call in emitted}
    assert set(by_id) == {"req-soon", "req-later", "req-broken"}
    assert all(call["event"] == events.SUBMITTED for call in emitted)
    assert by_id["req-soon"]["resource"] == {"prefect.resource.id": "fedunlearn.request.req-soon",
                                             "prefect.resource.name": "req-soon", "fedunlearn.scenario": "wine-vfl",
                                             "fedunlearn.urgent": "true"}
    assert by_id["req-later"]["resource"]["fedunlearn.urgent"] == "false"
    assert by_id["req-broken"]["resource"]["fedunlearn.scenario"] == SCENARIO  # the served scenario by default
    events.announce_processed(["req-soon"], "wine-vfl", "forgotten", "batch-1")
    assert emitted[-1]["event"] == events.PROCESSED and emitted[-1]["payload"]["outcome"] == "forgotten"


def test_the_batch_triggers_follow_params(monkeypatch):
    from flows.serve import batch_triggers

    count, urgent, waited = batch_triggers(SCENARIO, RequestsConfig(batch_threshold=7, max_wait_hours=12))
    assert (count.threshold, count.expect, count.posture) == (7, {events.SUBMITTED}, "Reactive")
    assert count.match.root["fedunlearn.scenario"] == SCENARIO
    assert urgent.threshold == 1 and urgent.match.root["fedunlearn.urgent"] == "true"
    assert waited.posture == "Proactive" and waited.after == {events.SUBMITTED} and waited.expect == {events.PROCESSED}
    assert waited.for_each == {"prefect.resource.id"} and waited.within == timedelta(hours=12)


def test_status_lists_pending_requests_overdue_first_and_exits_9_when_one_is_overdue(workspace, capsys,
                                                                                     monkeypatch):
    from test_status_lines import quarantine_examples

    def cli(*args: str) -> tuple[int, str]:
        code = main(["--root", str(workspace), *args])
        return code, capsys.readouterr().out

    code, out = cli("status", "--scenario", SCENARIO)
    assert code == 0 and "no pending requests" in out and "last batch: none yet" in out
    assert "quarantined" not in out
    _, on_time = cli("request", "client", "--scenario", SCENARIO, "--client", "1")
    past = (utc_now() - timedelta(hours=2)).isoformat()
    monkeypatch.setenv(CLOCK_VARIABLE, (utc_now() - timedelta(hours=3)).isoformat())  # submitted before its deadline
    _, late = cli("request", "client", "--scenario", SCENARIO, "--client", "2", "--deadline", past)
    monkeypatch.delenv(CLOCK_VARIABLE)
    code, out = cli("status", "--scenario", SCENARIO)
    assert code == RequestOverdue.exit_code == 9
    rows = [line for line in out.splitlines() if line.startswith("req-")]  # plain text for a terminal
    assert [row.split()[0] for row in rows] == [late.strip(), on_time.strip()]  # overdue first
    assert "OVERDUE by 2.0 h" in rows[0] and "2 pending request(s), 1 OVERDUE" in out and "**" not in out
    assert "29.9 d" in rows[1] or "30.0 d" in rows[1]  # the default deadline: one month after submission

    # Issue 37: a request a batch quarantined (IDs deleted already, a malformed file) stays in sight, with
    # its reason and what to do; the sample IDs it names do not (tasks.status_lines).
    named = quarantine_examples(workspace)
    code, out = cli("status", "--scenario", SCENARIO)
    assert code == 9 and "2 quarantined request(s), never applied" in out
    quarantined = out[out.index("quarantined request(s)"):].splitlines()
    assert any(row.startswith("req-") and "already deleted" in row and "(2 sample IDs)" in row for row in quarantined)
    assert any(row.startswith("file broken.json ") and "deadline" in row for row in quarantined)
    assert "what to do: fix each request and submit it again" in out
    assert not any(sample_id in out for sample_id in named)


@pytest.mark.parametrize("deadline", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00Z", "12345"])
def test_request_refuses_a_deadline_that_cannot_be_met_with_exit_2_and_one_error_line(workspace, capsys, deadline):
    code = main(["--root", str(workspace), "request", "client", "--scenario", SCENARIO, "--client", "1",
                 "--deadline", deadline])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: deadline") and err.count("\n") == 1 and "Traceback" not in err
    assert not list((workspace / "data/deletion_requests/inbox").glob("*.json"))


def test_a_batch_with_no_model_to_unlearn_from_deletes_nothing_and_status_lists_its_request_once(
        workspace, prefect_server, capsys):
    """The batch reads its source model where it starts, before the ledger moves: with none
    registered, nothing is deleted, the error says what to train, and status shows the request in
    its batch once (its file still in the inbox)."""
    from fedunlearn.requests.ledger import LEDGER_PATH, Ledger
    from stores.workspace import data_version

    def cli(*args: str):
        code = main(["--root", str(workspace), *args])
        return code, capsys.readouterr()

    # arrange
    cli("prepare", "--scenario", SCENARIO)
    ids = cli("ids", "--scenario", SCENARIO, "--client", "1", "--limit", "3")[1].out.split()
    request_id = cli("request", "samples", "--scenario", SCENARIO, "--ids", *ids)[1].out.strip()
    before = data_version(workspace, SCENARIO)

    # act
    code, printed = cli("process", "--scenario", SCENARIO)

    # assert
    assert code == 1 and "failed at reading the source model: no registered version of digits-hfl" in printed.err
    assert f"`fedunlearn train --scenario {SCENARIO}`" in printed.err
    assert data_version(workspace, SCENARIO) == before and Ledger(workspace / LEDGER_PATH).entries() == []
    rows = [line for line in cli("status", "--scenario", SCENARIO)[1].out.splitlines() if line.startswith("req-")]
    assert len(rows) == 1 and rows[0].split()[0] == request_id
    assert "(in a batch, data not yet deleted)" in rows[0] and "inbox" not in rows[0]
