"""The reliability suite (issue #10): fault injection, hostile input, concurrency.

``make reliability`` sets ``RELIABILITY_FULL=1``: every fault stage and the full number of
generated inputs. ``make test`` runs a fast subset of the same tests. Either way the terminal
summary prints what was tried: faults injected, bad-input classes and files, requests lost."""

from __future__ import annotations

import os
from collections import Counter

import pytest

FULL = os.environ.get("RELIABILITY_FULL") == "1"


class ReliabilityReport:
    """Counts collected by the tests: ``count(key, n)`` adds to a figure, ``cover(kind)`` records
    one distinct class of bad input (a set: covering a class twice counts it once)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.classes: set[str] = set()

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def cover(self, kind: str) -> None:
        self.classes.add(kind)

    def lines(self) -> list[str]:
        lines = [f"mode: {'full (make reliability)' if FULL else 'fast subset (make test)'}"]
        if self.classes:
            lines.append(f"distinct bad-input classes: {len(self.classes)}")
        lines += [f"{key}: {value}" for key, value in sorted(self.counts.items())]
        return lines


REPORT = ReliabilityReport()


@pytest.fixture(scope="session")
def reliability_report() -> ReliabilityReport:
    return REPORT


def pytest_terminal_summary(terminalreporter) -> None:
    if REPORT.counts or REPORT.classes:
        terminalreporter.section("reliability figures")
        for line in REPORT.lines():
            terminalreporter.write_line(line)
