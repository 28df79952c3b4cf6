"""The CLI of a digits-hfl workspace at a simulated time (``FEDUNLEARN_NOW``), for the two-tier flow
tests (tests/test_forgetting_tiers_flow.py, tests/test_forgetting_tiers_exact.py)."""

from datetime import datetime, timezone
from pathlib import Path

import pytest

from fedunlearn.requests.model import CLOCK_VARIABLE
from stores.registry import Registry
from workspaces import Printed, call_cli, copy_workspace

SCENARIO = "digits-hfl"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


class Clock:
    """The CLI of one workspace at a simulated time (``FEDUNLEARN_NOW``, set for the call alone)."""

    def __init__(self, workspace: Path):
        self.workspace = workspace

    def call(self, *args: str, at: datetime = T0) -> Printed:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(CLOCK_VARIABLE, at.isoformat())
            return call_cli(self.workspace, *args)

    def ok(self, *args: str, at: datetime = T0) -> str:
        """A call that must succeed (it arranges a test's state): what it printed."""
        printed = self.call(*args, at=at)
        assert printed.status == 0, printed.err
        return printed.out



def trained_copy(template: Path, directory: Path) -> Path:
    return copy_workspace(template, directory / "workspace")



def request(clock: Clock, client: int, deadline: datetime | None = None, at: datetime = T0) -> list[str]:
    ids = clock.ok("ids", "--scenario", SCENARIO, "--client", str(client), "--limit", "12", at=at).split()
    extra = ["--deadline", deadline.isoformat()] if deadline else []
    return [clock.ok("request", "samples", "--scenario", SCENARIO, "--ids", *ids, *extra, at=at).strip()]


def current(workspace):
    return Registry(workspace).by_alias(SCENARIO, "current")

