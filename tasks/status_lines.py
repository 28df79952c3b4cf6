"""The lines of ``fedunlearn status`` that take a decision, as plain functions (``tasks.status`` reads
the files and asks Prefect): the quarantined requests, with their reasons stripped of the sample IDs
they quote and escaped for markdown, and the next exact retrain Prefect has scheduled."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from fedunlearn.requests.inbox import REASON_SUFFIX, Quarantined

QUARANTINE_DIR = "data/deletion_requests/quarantine"
REASON_CHARS = 240  # of a reason shown; the reason file beside the request holds it whole
_MASK = "\0"
# What a reason quotes of a file that did not parse (``model.describe_validation_error``): a value the
# file held, which may be a sample ID.
_QUOTED_INPUT = re.compile(r" \(got (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^)]*)\)")
_MASKED_LIST = re.compile(rf"\[?'?{_MASK}'?(?:, '?{_MASK}'?)*\]?")
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~])")


@dataclass(frozen=True)
class QuarantineLine:
    request: str  # the request ID, else the file's name in quarantine/
    file: str
    at: datetime | None
    reason: str  # without sample IDs, escaped for markdown


def without_sample_ids(reason: str, sample_ids: Iterable[str]) -> str:
    """``reason`` with every sample ID it quotes of ``sample_ids`` (the request's) replaced by a count, and
    any value quoted from a file that did not parse left out: ``status`` names requests, never samples."""
    for sample_id in sorted({i for i in sample_ids if i and i in reason}, key=len, reverse=True):
        reason = reason.replace(sample_id, _MASK)
    counted = _MASKED_LIST.sub(lambda m: _ids(m.group().count(_MASK)), reason)
    return _QUOTED_INPUT.sub(" (the value is in the file)", counted).replace(_MASK, "")


def _ids(n: int) -> str:
    return f"({n} sample ID{'s' if n != 1 else ''})"


def markdown_text(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters, with markdown's active characters escaped: a
    reason shows as written, in a table cell or a terminal alike."""
    line = "".join(c if c.isprintable() else " " for c in text).strip()
    if len(line) > limit:
        line = line[:limit - 1].rstrip() + "…"
    return _MARKDOWN.sub(r"\\\1", line)


def quarantine_line(quarantined: Quarantined, sample_ids: Iterable[str]) -> QuarantineLine:
    return QuarantineLine(quarantined.request_id or f"file {quarantined.name}", quarantined.name, quarantined.at,
                          markdown_text(without_sample_ids(quarantined.reason, sample_ids)))


def quarantine_lines(shown: list[QuarantineLine], count: int) -> list[str]:
    """How many requests are in quarantine, the latest with their reasons, and what to do; nothing when
    none is."""
    if not count:
        return []
    listed = f" (the latest {len(shown)} listed)" if count > len(shown) else ""
    lines = ["", f"**{count} quarantined request(s)**, never applied{listed}: each reason in full in "
                 f"{QUARANTINE_DIR}/<file>{REASON_SUFFIX}", "",
             "| request | quarantined | reason |", "|---|---|---|"]
    lines += [f"| {q.request} | {f'{q.at:%Y-%m-%d %H:%M}Z' if q.at else '?'} | {q.reason} |" for q in shown]
    return lines + ["", "what to do: fix each request and submit it again (`fedunlearn request ...`, or the fixed "
                        "file into data/deletion_requests/inbox/); then delete the file and its reason from "
                        f"{QUARANTINE_DIR}/, which takes it off this list"]


@dataclass(frozen=True)
class ScheduledRetrain:
    """What the Prefect API says of the exact retrain that repays the debt."""

    deployment: str | None = None  # the served repay deployment; None: no server has one
    at: datetime | None = None  # its earliest scheduled run for the workspace and scenario
    paused: bool = False  # registered, but not served now (paused when its server stopped)
    unknown: str | None = None  # why no server was asked, or why it did not answer


def runs_for(parameters: dict[str, Any], root: Path, scenario: str) -> bool:
    """Whether a flow run with these parameters retrains this workspace's ``scenario``: one Prefect
    server may serve several workspaces, each scheduling its own repayments."""
    if parameters.get("scenario") != scenario:
        return False
    named = parameters.get("root")
    return named is None or Path(named).resolve() == Path(root).resolve()


def next_retrain_line(scheduled: ScheduledRetrain, scenario: str, start_by: datetime | None) -> str:
    """The next exact retrain by its time and deployment, or what to run when none is scheduled."""
    safe = f"{start_by:%Y-%m-%d %H:%M}Z" if start_by else None
    run = (f"run `fedunlearn repay-debt --scenario {scenario}`" + (f" before {safe} (its latest safe start)"
                                                                    if safe else ""))
    if scheduled.at is not None and not scheduled.paused:
        late = (f" — after the latest safe start {safe}: {run} instead" if start_by and scheduled.at > start_by
                else "")
        return f"next exact retrain: {scheduled.at:%Y-%m-%d %H:%M}Z ({scheduled.deployment}){late}"
    if scheduled.unknown:
        why = scheduled.unknown
    elif scheduled.deployment is None:
        why = "no server serves repay-retrain-debt"
    elif scheduled.paused:
        why = f"{scheduled.deployment} is paused: its server stopped"
    else:
        why = f"{scheduled.deployment} is served but has no run scheduled for {scenario}"
    return f"next exact retrain: none scheduled ({why}); {run}, or serve the deployments (`make serve`)"
