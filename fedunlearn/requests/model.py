"""The deletion request: a typed model (also the Prefect UI form), generated IDs, and parsing
of request files with messages that say what was wrong and how to fix it.

A request names *what* to forget: ``sample`` (a list of sample IDs), ``class`` (a label) or
``client`` (a client of an HFL/DFL partition), within one ``scenario``. Files in the inbox
look like::

    {"request_id": "req-20250101T120000Z-1a2b3c4d", "kind": "sample", "scenario": "mnist5k-hfl",
     "sample_ids": ["mnist5k-00012", "mnist5k-00345"], "submitted_at": "2025-01-01T12:00:00Z",
     "reason": "user asked on 2025-01-01"}
"""

from __future__ import annotations

import json
import os
import re
import secrets
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

MAX_REQUEST_BYTES = 10 * 1024 * 1024
# A submitted_at further ahead than this is not clock skew but a wrong date (a deadline computed from it
# would never come due).
MAX_FUTURE = timedelta(days=1)
MAX_IDS_PER_REQUEST = 100_000
MAX_SAMPLE_ID_LENGTH = 512
MAX_REASON_LENGTH = 2000
# A request ID doubles as a file name (<request_id>.json): a safe charset, no leading dot, no "..".
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SCENARIO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class RequestError(ValueError):
    """A request that cannot be accepted; the message says what was wrong and what to do."""


class IncompleteRequest(RequestError):
    """The file does not parse (yet): empty, cut inside a UTF-8 character, or malformed JSON — what a
    file still being written looks like. The inbox waits for a young one (``inbox_grace_seconds``)."""


class RequestKind(str, Enum):
    SAMPLE = "sample"
    CLASS = "class"
    CLIENT = "client"


SUBJECT_FIELDS = {RequestKind.SAMPLE: "sample_ids", RequestKind.CLASS: "label", RequestKind.CLIENT: "client"}


# An injected clock for simulations and tests (scripts/month_of_traffic.py replays a month in minutes):
# ISO 8601 UTC. Request times, deadlines, receipts and `status` read it; Prefect and MLflow keep real time.
CLOCK_VARIABLE = "FEDUNLEARN_NOW"


# A deadline given as a plain number (a JSON number, or digits on the command line).
NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def in_utc(value: datetime) -> datetime:
    """An aware time in UTC; one that has no UTC form (``9999-12-31T23:59:59-23:59`` is in year 10000
    there, ``0001-01-01T00:00:00+01:00`` in year 0) is refused, since it cannot be compared with any other."""
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise ValueError(f"{value.isoformat()} is out of range once converted to UTC (years 1 to 9999): give a "
                         "time that exists in UTC") from None


def utc_now() -> datetime:
    """Now, in UTC — or the time in ``$FEDUNLEARN_NOW`` when a simulation sets one."""
    injected = os.environ.get(CLOCK_VARIABLE)
    if injected:
        try:
            return datetime.fromisoformat(injected).astimezone(timezone.utc)
        except ValueError as err:
            raise ValueError(f"{CLOCK_VARIABLE}={injected!r} is not an ISO 8601 time; unset it to use the real "
                             "clock") from err
    return datetime.now(timezone.utc)


def timestamped_id(prefix: str, hex_chars: int = 8) -> str:
    """``<prefix>-<UTC timestamp>-<random hex>``: sortable by time, unique without coordination."""
    return f"{prefix}-{utc_now():%Y%m%dT%H%M%SZ}-{secrets.token_hex(hex_chars // 2)}"


def new_request_id() -> str:
    return timestamped_id("req")


class DeletionRequestModel(BaseModel):
    """A right-to-be-forgotten request. Set exactly the subject field of its kind:
    ``sample_ids`` (kind sample), ``label`` (kind class) or ``client`` (kind client)."""

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(default_factory=new_request_id,
                            description="unique ID (generated when left empty); also the inbox file name")
    kind: RequestKind = Field(description="what to forget: listed samples, a whole class, or a whole client")
    scenario: str | None = Field(None, pattern=SCENARIO_PATTERN,
                                 description="scenario whose data the subject refers to (default: the one ingested)")
    sample_ids: list[str] | None = Field(None, description="kind=sample: IDs as printed by `fedunlearn ids`")
    label: int | None = Field(None, description="kind=class: the class label to forget")
    client: int | None = Field(None, description="kind=client: the client whose data to forget (HFL/DFL)")
    submitted_at: datetime = Field(default_factory=utc_now, description="when the request was made (UTC)")
    deadline: datetime | None = Field(None, description="when it must be forgotten by (UTC; default: submitted_at "
                                                        "+ requests.deadline_days of params.yaml, one month)")
    reason: str | None = Field(None, max_length=MAX_REASON_LENGTH, description="optional note kept with the request")

    @field_validator("request_id", mode="before")
    @classmethod
    def _generate_when_empty(cls, value: Any) -> Any:
        # A form field left blank arrives as "" or null; any other value (false, 0, []) is a wrong type.
        return new_request_id() if value is None or value == "" else value

    @field_validator("request_id")
    @classmethod
    def _safe_request_id(cls, value: str) -> str:
        if not REQUEST_ID_PATTERN.fullmatch(value) or ".." in value:  # fullmatch: "$" allows a final newline
            raise ValueError(f"request_id {value!r} is not allowed: use 1-128 characters from A-Z a-z 0-9 . _ -, "
                             "starting with a letter or digit and without '..'")
        return value

    @field_validator("sample_ids")
    @classmethod
    def _clean_sample_ids(cls, ids: list[str] | None) -> list[str] | None:
        if ids is None:
            return None
        if len(ids) > MAX_IDS_PER_REQUEST:
            raise ValueError(f"{len(ids)} sample IDs in one request; the limit is {MAX_IDS_PER_REQUEST}: "
                             "split it into several requests")
        cleaned = [i.strip() for i in ids]
        bad = [i for i in cleaned if not i or len(i) > MAX_SAMPLE_ID_LENGTH or not i.isprintable()]
        if bad:
            raise ValueError(f"{len(bad)} sample ID(s) are empty, longer than {MAX_SAMPLE_ID_LENGTH} characters "
                             f"or contain control characters, e.g. {bad[0]!r}")
        return list(dict.fromkeys(cleaned))  # an ID named twice in one request is one ID

    @field_validator("label", "client", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        # Lax pydantic reads true as 1 and the text "0_1" as 1: either would silently forget another class
        # or client than the one meant.
        if isinstance(value, (bool, str)):
            raise ValueError(f"a JSON {'boolean' if isinstance(value, bool) else 'string'} is not a number: give "
                             "the class label or client as an integer")
        return value

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline_not_a_number(cls, value: Any) -> Any:
        # pydantic reads a number (or a text of digits) as seconds since 1970: `--deadline 12345` would be a
        # deadline in 1970, not what anyone typing it meant.
        if isinstance(value, (bool, int, float)) or (isinstance(value, str) and NUMBER.fullmatch(value)):
            raise ValueError(f"{value!r} is a number, not a date: give the deadline as an ISO 8601 time, e.g. "
                             "2026-12-01T00:00Z, or leave it out for the default (requests.deadline_days after "
                             "submission)")
        return value

    @field_validator("deadline")
    @classmethod
    def _deadline_after_submission(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else in_utc(value)
        submitted = info.data.get("submitted_at")  # validated before: it is declared first
        if submitted is not None and value <= submitted:
            raise ValueError(f"{value.isoformat()} is not after the request was submitted "
                             f"({submitted.isoformat(timespec='seconds')}): no batch could meet it. Give a later "
                             "deadline, or leave it out for the default (requests.deadline_days after submission)")
        return value

    def due(self, deadline_days: float) -> datetime:
        """The deadline: the one the request names, else ``deadline_days`` after it was submitted."""
        return self.deadline or self.submitted_at + timedelta(days=deadline_days)

    @field_validator("submitted_at")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        # A time without a zone is read as UTC, so every timestamp in the records compares.
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else in_utc(value)
        if value - utc_now() > MAX_FUTURE:
            raise ValueError(f"{value.isoformat()} is more than a day in the future (now {utc_now():%Y-%m-%dT%H:%M}Z): "
                             "give the time the request was made, in UTC")
        return value

    @model_validator(mode="after")
    def _subject_matches_kind(self) -> "DeletionRequestModel":
        wanted = SUBJECT_FIELDS[self.kind]
        others = [f for f in SUBJECT_FIELDS.values() if f != wanted and getattr(self, f) is not None]
        if others:
            raise ValueError(f"a {self.kind.value} request sets only {wanted!r}; remove {', '.join(others)}")
        if getattr(self, wanted) is None:
            raise ValueError(f"a {self.kind.value} request needs {wanted!r} (its subject)")
        if self.kind is RequestKind.SAMPLE and not self.sample_ids:
            raise ValueError("empty subject: 'sample_ids' lists no IDs")
        return self

    @property
    def subject(self) -> dict[str, Any]:
        field = SUBJECT_FIELDS[self.kind]
        return {field: getattr(self, field)}

    def same_subject(self, other: "DeletionRequestModel") -> bool:
        """Same kind, scenario and subject: a re-submission of the same request."""
        return (self.kind, self.scenario, self.subject) == (other.kind, other.scenario, other.subject)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), indent=2, sort_keys=True) + "\n"


def _field_name(part: str | int) -> str:
    """A field name as written in a reason: an unknown key comes from the file, so one with line
    breaks or other unprintable characters, or a long one, is quoted and cut (a reason stays one line)."""
    text = str(part)
    return text if text.isprintable() and len(text) <= 60 else repr(text[:60])


def describe_validation_error(err: ValidationError) -> str:
    """One line per problem: ``field: message`` (pydantic's own text, without its URLs)."""
    lines = []
    for problem in err.errors():
        where = ".".join(_field_name(part) for part in problem["loc"]) or "request"
        given = problem.get("input")
        shown = f" (got {given!r})" if isinstance(given, (str, int, float)) and len(repr(given)) <= 60 else ""
        lines.append(f"{where}: {problem['msg'].removeprefix('Value error, ')}{shown}")
    return "; ".join(lines)


def build_request(fields: dict[str, Any]) -> DeletionRequestModel:
    """Validate request fields; raises :class:`RequestError` naming each bad field."""
    try:
        return DeletionRequestModel.model_validate(fields)
    except ValidationError as err:
        raise RequestError(describe_validation_error(err)) from None


class DuplicateKey(ValueError):
    """A key repeated within one JSON object."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads silently keeps the last of repeated keys; in a request that hides what is asked for.
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise DuplicateKey(key)
        document[key] = value
    return document


def parse_request(data: bytes, defaults: dict[str, Any]) -> DeletionRequestModel:
    """Parse a request file's bytes. ``defaults`` fills fields the file leaves out (the file
    name's stem as ``request_id``, the ingested scenario, the file time as ``submitted_at``):
    deterministic, so a re-run after a crash recognises the same request."""
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestError(f"file is larger than {MAX_REQUEST_BYTES // 2**20} MiB, the limit for one request: "
                           "split it into several")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise IncompleteRequest(f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        document = json.loads(text, object_pairs_hook=_object_without_duplicate_keys)
    except json.JSONDecodeError as err:
        raise IncompleteRequest(f"malformed JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise RequestError("malformed JSON: nested too deeply") from None
    except DuplicateKey as err:
        raise RequestError(f"malformed JSON: key {err.key!r} appears twice in one object, so which value is "
                           "meant is ambiguous: give each field once") from None
    except ValueError as err:  # an integer of more than 4300 digits: Python refuses to convert it
        raise RequestError(f"malformed JSON: {str(err).partition(':')[0]}") from None
    if not isinstance(document, dict):
        raise RequestError(f"a request must be a JSON object ({{...}}), got a JSON {type(document).__name__}")
    # Blank fields take the defaults too: a random request_id would make a re-run see a new request.
    return build_request({**defaults, **{k: v for k, v in document.items() if v is not None and v != ""}})
