"""Prefect events of deletion requests; ``flows.serve``'s deployment triggers act on them.

    fedunlearn.request.submitted  a request file arrived in the inbox (``fedunlearn request``, the
                                  ``submit-deletion-requests`` form, or a file put there by
                                  anything else: the inbox watcher of ``fedunlearn serve`` sees
                                  every one, so each arrival is announced once, whoever wrote it),
                                  or a request applied under another scenario of the dataset is
                                  owed forgetting by this one (``announce_owed``)
    fedunlearn.request.processed  a batch finished with it: forgotten (receipt written) or
                                  quarantined

Each event's resource is the request, ``fedunlearn.request.<request_id>``, labelled with its
scenario and whether it is urgent (due within ``requests.urgent_hours``), so that a trigger can
count submissions, react at once to an urgent one, and match a submission with its processing.
Events are a signal, not the record: the inbox and the ledger are. A lost event delays a batch
to the next trigger or the cron backstop; a duplicate one starts a batch that finds nothing new.
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

from prefect.events import emit_event

from fedunlearn.requests.inbox import unsafe_name_problem
from fedunlearn.requests.model import utc_now

SUBMITTED = "fedunlearn.request.submitted"
PROCESSED = "fedunlearn.request.processed"
RESOURCE_PREFIX = "fedunlearn.request."
SCENARIO_LABEL = "fedunlearn.scenario"
URGENT_LABEL = "fedunlearn.urgent"

logger = logging.getLogger(__name__)


def resource(request_id: str, scenario: str, urgent: bool = False) -> dict[str, str]:
    return {"prefect.resource.id": f"{RESOURCE_PREFIX}{request_id}", "prefect.resource.name": request_id,
            SCENARIO_LABEL: scenario, URGENT_LABEL: "true" if urgent else "false"}


def _parse_time(value: object) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return parsed.astimezone(timezone.utc) if parsed.tzinfo else None
    except (ValueError, OverflowError):  # no UTC form (year 0 or 10000 there): the batch quarantines the file
        return None


def announce_file(path: Path, default_scenario: str, deadline_days: float, urgent_hours: float) -> bool:
    """Emit ``fedunlearn.request.submitted`` for the inbox file ``path``; False for a file that is
    not a request file by name (hidden, staging, not .json). The file is read leniently: its
    validation is the batch's job, here it only supplies the scenario and the deadline."""
    if unsafe_name_problem(path.name):
        return False
    try:
        document = json.loads(path.read_bytes()[:1_000_000])
    except (OSError, ValueError):
        document = {}
    document = document if isinstance(document, dict) else {}
    scenario = str(document.get("scenario") or default_scenario)
    submitted = _parse_time(document.get("submitted_at")) or utc_now()
    try:
        deadline = _parse_time(document.get("deadline")) or submitted + timedelta(days=deadline_days)
    except OverflowError:  # submitted in year 9999: the batch refuses it; announced as urgent, to be seen soon
        deadline = submitted
    urgent = deadline - utc_now() <= timedelta(hours=urgent_hours)
    request_id = str(document.get("request_id") or path.name.removesuffix(".json"))
    emit_event(SUBMITTED, resource=resource(request_id, scenario, urgent),
               payload={"scenario": scenario, "file": path.name, "deadline": deadline.isoformat(),
                        "urgent": urgent})
    return True


def announce_owed(request_ids: list[str], scenario: str, batch_id: str, due: datetime, urgent_hours: float) -> None:
    """``fedunlearn.request.submitted`` per request a sibling scenario owes forgetting (applied under
    another scenario of its dataset, ``tasks.siblings``): the sibling's served deletion batches are
    triggered by it as by a new request, and its batch's ``processed`` event answers it."""
    urgent = due - utc_now() <= timedelta(hours=urgent_hours)
    for request_id in request_ids:
        emit_event(SUBMITTED, resource=resource(request_id, scenario, urgent),
                   payload={"scenario": scenario, "owed_by": batch_id, "deadline": due.isoformat(), "urgent": urgent})


def announce_processed(request_ids: list[str], scenario: str, outcome: str, batch_id: str) -> None:
    """``fedunlearn.request.processed`` per request (``outcome``: forgotten or quarantined)."""
    for request_id in request_ids:
        emit_event(PROCESSED, resource=resource(request_id, scenario),
                   payload={"scenario": scenario, "outcome": outcome, "batch_id": batch_id})


class InboxWatcher(threading.Thread):
    """Announces every request file that arrives in ``inbox`` (inotify, through watchfiles): first
    the files already there when it starts (they may have arrived while nothing watched), then each
    new one. Runs in the serving process beside the deployments; ``stop()`` ends it."""

    def __init__(self, inbox: Path, scenario: str, deadline_days: float, urgent_hours: float):
        super().__init__(name="fedunlearn-inbox-watcher", daemon=True)
        self.inbox, self.scenario = Path(inbox), scenario
        self.deadline_days, self.urgent_hours = deadline_days, urgent_hours
        self._stop_event = threading.Event()
        self.announced = 0

    def _announce(self, path: Path) -> None:
        try:
            if path.parent == self.inbox and path.is_file() and announce_file(
                    path, self.scenario, self.deadline_days, self.urgent_hours):
                self.announced += 1
        except Exception:  # a watcher that dies stops every later announcement: log and go on
            logger.exception("could not announce %s", path)

    def run(self) -> None:
        from watchfiles import Change, watch

        for path in sorted(self.inbox.iterdir()):
            self._announce(path)
        for changes in watch(self.inbox, stop_event=self._stop_event, recursive=False, debounce=200,
                             watch_filter=lambda change, _: change is Change.added):
            for _, name in sorted(changes, key=lambda c: c[1]):
                self._announce(Path(name))

    def stop(self) -> None:
        self._stop_event.set()
