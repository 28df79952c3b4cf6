"""Hostile input (issue #10, item 2): generated request files thrown at the inbox.

A catalogue of named classes of bad input (files that are not JSON or not UTF-8, wrong types per
field, huge ID lists, unicode and control characters, IDs and names that look like paths, links,
FIFOs, request IDs reused across files, ...), each a Hypothesis strategy of many variants and the
reason its files must be quarantined with. A few hostile but valid classes (duplicate IDs within
and across files, a re-submission, a replayed request) must be processed instead, each ID deleted
once.

* Property: an inbox holding one generated variant of every class, mixed with valid requests, goes
  through the data-plane steps of ``ingest-deletions`` (scan, triage, the Great Expectations checks
  against the data version, quarantine, ledger) without Prefect. Nothing raises; every bad file is
  in quarantine/ with a one-line reason naming its problem; every valid one is in processed/ and
  the ledger; no file is lost and nothing outside the inbox is touched.
* The same with one representative per class through the ``ingest-deletions`` flow.
* The acceptance check through ``fedunlearn process``: a file with a path-traversal name, a
  malformed file and a valid file give one processed request and two quarantined, with reasons.

``RELIABILITY_FULL=1`` (``make reliability``) generates many more inboxes than the fast subset.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import string
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from random import Random
from typing import Callable

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

import flows.ingest as ingest
from cli import main
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, LedgerEntry
from fedunlearn.requests.catalog import load_catalog
from fedunlearn.requests.folders import RequestFolders
from fedunlearn.requests.inbox import REASON_SUFFIX, file_processed, quarantine
from fedunlearn.requests.model import MAX_IDS_PER_REQUEST, MAX_REQUEST_BYTES, MAX_SAMPLE_ID_LENGTH
from tasks.requests import read_inbox
from tasks.validation import validate_requests
from stores.workspace import Workspace, init_workspace, reproduce

FULL = os.environ.get("RELIABILITY_FULL") == "1"
SCENARIO = "digits-hfl"
GENERATED_INBOXES = 150 if FULL else 5  # each holds a variant of every class: 60-odd files
APPLIED = "applied-earlier"  # a request already in the ledger when the inbox is read: all of client 2
OUTSIDE_REQUEST = b'{"kind": "client", "client": 0, "request_id": "outside-target"}'
OUTSIDE_SECRET = b"root:x:0:0:root:/root:/bin/bash\n"
REASON_FILE_KEYS = ["file", "request_id", "quarantined_at", "reason", "what to do"]
MODEL_FIELDS = {"request_id", "kind", "scenario", "sample_ids", "label", "client", "submitted_at", "deadline", "reason"}


@dataclass(frozen=True)
class DataFacts:
    """What generated requests refer to in a prepared digits-hfl workspace."""

    root: Path
    outside: Path  # a folder beside the workspace: what links out of the inbox point at
    ledger: str = field(repr=False)  # the ledger before the inbox is read: the line of APPLIED
    live_ids: tuple[str, ...] = field(repr=False)  # training samples of clients 0 and 1: valid subjects
    deleted_ids: tuple[str, ...] = field(repr=False)  # client 2's samples, deleted by APPLIED
    live_labels: tuple[int, ...]  # classes with training samples left
    num_classes: int
    num_clients: int

    @property
    def inbox(self) -> Path:
        return RequestFolders(self.root).inbox


@dataclass(frozen=True, repr=False)
class InboxFile:
    """One entry to put into the inbox and where it must end up."""

    name: str | bytes  # bytes: a name that is not UTF-8
    # Large contents are a recipe, built when placed: Hypothesis keeps every value it drew until the
    # test ends, and 150 inboxes of 10 MiB files would take gigabytes.
    content: bytes | Callable[[], bytes] = b""
    node: str = "file"  # file | directory | fifo | symlink | hardlink
    target: str = ""  # symlink target, or the file a hard link shares
    reason: str | None = None  # regex the quarantine reason must match; None: must be processed
    request_id: str | None = None  # processed: the request the ledger holds for it
    deletes: tuple[str, ...] = ()  # processed sample requests: the IDs deleted by it or merged into another

    @property
    def scanned_name(self) -> str:
        """The name as the inbox scan sees it (undecodable bytes as surrogates)."""
        return os.fsdecode(os.fsencode(self.name))

    def payload(self) -> bytes:
        return self.content() if callable(self.content) else self.content

    def __repr__(self) -> str:
        # Hypothesis prints every draw of a failing example: a long content must not be printed whole.
        content = (repr(self.content) if callable(self.content) else
                   repr(self.content[:100]) + (f"... ({len(self.content)} bytes)" if len(self.content) > 100 else ""))
        return (f"InboxFile({self.name!r}, {content}, node={self.node!r}, target={self.target!r}, "
                f"reason={self.reason!r}, request_id={self.request_id!r})")

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis's printer would otherwise list a dataclass's fields in full


Variants = Callable[[DataFacts, str], st.SearchStrategy[list[InboxFile]]]


@dataclass(frozen=True)
class HostileClass:
    name: str
    variants: Variants  # (facts, slug) -> the files of one variant, named after the slug
    rejected: bool

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")[:48]


CATALOGUE: list[HostileClass] = []


def hostile(name: str, rejected: bool = True) -> Callable[[Variants], Variants]:
    def register(variants: Variants) -> Variants:
        CATALOGUE.append(HostileClass(name, variants, rejected))
        return variants
    return register


# --- building blocks -------------------------------------------------------------------------

def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def one_file(slug: str, contents: st.SearchStrategy, reason: str) -> st.SearchStrategy[list[InboxFile]]:
    return contents.map(lambda content: [InboxFile(f"{slug}.json", content, reason=reason)])


def when_placed(build: Callable[..., bytes], *arguments: st.SearchStrategy) -> st.SearchStrategy[Callable[[], bytes]]:
    """The recipe ``build(*arguments)`` for a large content (see ``InboxFile.content``)."""
    return st.builds(partial, st.just(build), *arguments)


def with_field(fields: dict, key: str, values: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    return values.map(lambda value: json.dumps({**fields, key: value}).encode())


# Lone surrogates are a class of their own; the parser fills null and "" fields with defaults.
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
PRINTABLE = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
SAFE_TAIL = st.text(alphabet=string.ascii_lowercase + string.digits, min_size=1, max_size=8)
NUMBERS = st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False))
SCALARS = st.one_of(NUMBERS, st.booleans(), TEXT.filter(bool))
STRUCTURES = st.one_of(st.lists(SCALARS, max_size=3), st.dictionaries(TEXT, SCALARS, max_size=3))
NOT_TEXT = st.one_of(NUMBERS, st.booleans(), STRUCTURES)
FRACTIONS = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer())
NUMBER_FIELDS = st.sampled_from([("class", "label"), ("client", "client")])


def number_field_with(values: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """A class or client request whose number field (label or client) takes one of ``values``."""
    return st.tuples(NUMBER_FIELDS, values).map(lambda pair: body(kind=pair[0][0], **{pair[0][1]: pair[1]}))


def sample_request(ids: st.SearchStrategy[list]) -> st.SearchStrategy[bytes]:
    return ids.map(lambda sample_ids: body(kind="sample", sample_ids=sample_ids))


def live_ids(facts: DataFacts, min_size: int = 1, max_size: int = 6) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(facts.live_ids), min_size=min_size, max_size=max_size, unique=True)


def among_live_ids(facts: DataFacts, bad: st.SearchStrategy) -> st.SearchStrategy[list]:
    """Known IDs with one ``bad`` item at a random place."""
    return st.tuples(live_ids(facts, 0, 4), bad, st.integers(0, 4)).map(
        lambda t: t[0][:t[2]] + [t[1]] + t[0][t[2]:])


# --- the file itself --------------------------------------------------------------------------

@hostile("bytes that are not UTF-8")
def _(facts, slug):
    never_in_utf8 = st.sampled_from([b"\xff", b"\xfe"])
    return one_file(slug, st.tuples(st.binary(max_size=64), never_in_utf8, st.binary(max_size=64)).map(b"".join),
                    r"^not UTF-8 text \(")


@hostile("a request in another encoding (UTF-16, UTF-32, Latin-1)")
def _(facts, slug):
    text = json.dumps({"kind": "client", "client": 0, "reason": "café"}, ensure_ascii=False)
    return one_file(slug, st.sampled_from(["utf-16", "utf-32", "latin-1"]).map(text.encode), r"^not UTF-8 text \(")


@hostile("overlong or surrogate UTF-8 sequences in a string")
def _(facts, slug):
    sequences = st.sampled_from([b"\xc0\xaf", b"\xe0\x80\xaf", b"\xc1\xbf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
    return one_file(slug, sequences.map(lambda s: b'{"kind": "sample", "sample_ids": ["digits-' + s + b'"]}'),
                    r"^not UTF-8 text \(")


@hostile("empty or blank file")
def _(facts, slug):
    return one_file(slug, st.text(alphabet=" \t\r\n", max_size=20).map(str.encode), r"^malformed JSON: Expecting value")


def not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


@hostile("random text that is not JSON")
def _(facts, slug):
    return one_file(slug, st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60)
                    .filter(not_json).map(str.encode), r"^malformed JSON: ")


@st.composite
def truncated(draw, document: dict) -> bytes:
    whole = json.dumps(document).encode()
    return whole[:draw(st.integers(1, len(whole) - 1))]


@hostile("truncated request")
def _(facts, slug):
    documents = st.one_of(live_ids(facts).map(lambda ids: {"kind": "sample", "sample_ids": ids}),
                          st.just({"kind": "client", "client": 1, "reason": "please"}))
    return one_file(slug, documents.flatmap(truncated), r"^malformed JSON: ")


@hostile("a request followed by more data")
def _(facts, slug):
    extra = st.sampled_from([b'{"kind": "client", "client": 1}', b"garbage", b"]", b"}", b"0", b"null"])
    return one_file(slug, st.tuples(st.sampled_from([b"", b" ", b"\n"]), extra).map(
        lambda t: body(kind="client", client=0) + t[0] + t[1]), r"^malformed JSON: Extra data")


@hostile("JavaScript-style JSON: comments, single quotes, bare keys, trailing commas, hex")
def _(facts, slug):
    return one_file(slug, st.sampled_from([
        b'{"kind": "client", "client": 0} // user 42',
        b'/* user 42 */ {"kind": "client", "client": 0}',
        b"{'kind': 'client', 'client': 0}",
        b'{kind: "client", client: 0}',
        b'{"kind": "client", "client": 0,}',
        b'{"kind": "sample", "sample_ids": ["digits-00001",]}',
        b'{"kind": "client", "client": 0x0}',
    ]), r"^malformed JSON: ")


@hostile("UTF-8 byte-order mark")
def _(facts, slug):
    return one_file(slug, st.just(b"\xef\xbb\xbf" + body(kind="client", client=0)),
                    r"^malformed JSON: Unexpected UTF-8 BOM")


@hostile("JSON array at the top level")
def _(facts, slug):
    arrays = st.one_of(live_ids(facts, 0), st.lists(st.just({"kind": "client", "client": 0}), max_size=2))
    return one_file(slug, arrays.map(lambda a: json.dumps(a).encode()),
                    r"^a request must be a JSON object \(\{\.\.\.\}\), got a JSON list")


@hostile("JSON scalar at the top level")
def _(facts, slug):
    return one_file(slug, st.one_of(SCALARS, st.none()).map(lambda v: json.dumps(v).encode()),
                    r"^a request must be a JSON object \(\{\.\.\.\}\), got a JSON (int|float|bool|str|NoneType)$")


def nested(shape: str, depth: int) -> bytes:
    if shape == "arrays":
        return b"[" * depth + b"]" * depth
    if shape == "objects":
        return b'{"a": ' * depth + b"1" + b"}" * depth
    return b'{"kind": "class", "label": ' + b"[" * depth + b"]" * depth + b"}"


@hostile("nesting deeper than the parser allows")
def _(facts, slug):
    # Far deeper than Python's recursion limit (1000 unless raised; Hypothesis raises it while it runs).
    return one_file(slug, when_placed(nested, st.sampled_from(["arrays", "objects", "in a field"]),
                                      st.integers(20_000, 100_000)),
                    r"^malformed JSON: nested too deeply$")


@hostile("an integer with thousands of digits")
def _(facts, slug):
    limit = sys.get_int_max_str_digits()

    def document(where: str, digits: int) -> bytes:
        number = b"7" * digits
        return {"label": b'{"kind": "class", "label": ' + number + b"}",
                "client": b'{"kind": "client", "client": ' + number + b"}",
                "top level": number}[where]
    return one_file(slug, when_placed(document, st.sampled_from(["label", "client", "top level"]),
                                      st.integers(limit + 1, 4 * limit)), r"^malformed JSON: Exceeds the limit")


@hostile("NaN or Infinity where a number belongs")
def _(facts, slug):
    literals = st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999"])
    return one_file(slug, st.tuples(NUMBER_FIELDS, literals).map(
        lambda t: b'{"kind": "%s", "%s": %s}' % (t[0][0].encode(), t[0][1].encode(), t[1])),
        r"^(label|client): Input should be a finite number")


@hostile("the same key twice in one object")
def _(facts, slug):
    def document(key: str, first, second) -> bytes:
        pairs = [("kind", "client"), ("client", 0), (key, first), (key, second)]
        return ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}").encode()
    return one_file(slug, st.builds(document, st.sampled_from(["kind", "client", "request_id", "scenario", "x"]),
                                    SCALARS, SCALARS), r"^malformed JSON: key '.*' appears twice in one object")


@hostile("a file larger than the size limit")
def _(facts, slug):
    def document(style: str, extra: int) -> bytes:
        minimal = body(kind="client", client=0)
        return {"padding": minimal + b" " * (MAX_REQUEST_BYTES - len(minimal) + extra),
                "long reason": body(kind="client", client=0, reason="x" * (MAX_REQUEST_BYTES + extra)),
                "garbage": b"A" * (MAX_REQUEST_BYTES + extra)}[style]
    return one_file(slug, when_placed(document, st.sampled_from(["padding", "long reason", "garbage"]),
                                      st.integers(1, 4096)), r"^file is larger than 10 MiB")


# --- the fields ------------------------------------------------------------------------------

@hostile("no kind")
def _(facts, slug):
    subjects = st.sampled_from([{"client": 0}, {"label": 1}, {"sample_ids": [facts.live_ids[0]]}])
    blank_kind = st.sampled_from([{}, {"kind": None}, {"kind": ""}])
    return one_file(slug, st.tuples(subjects, blank_kind).map(lambda t: json.dumps({**t[0], **t[1]}).encode()),
                    r"^kind: Field required")


@hostile("unknown kind")
def _(facts, slug):
    kinds = st.one_of(st.sampled_from(["SAMPLE", "Class", "samples", "delete", "all", "*", " client"]),
                      TEXT.filter(lambda k: k not in {"", "sample", "class", "client"}))
    return one_file(slug, with_field({"client": 0}, "kind", kinds),
                    r"^kind: Input should be 'sample', 'class' or 'client'")


@hostile("kind of a wrong JSON type")
def _(facts, slug):
    return one_file(slug, with_field({"client": 0}, "kind", NOT_TEXT),
                    r"^kind: Input should be 'sample', 'class' or 'client'")


@hostile("unknown field")
def _(facts, slug):
    keys = st.one_of(st.sampled_from(["sample_id", "Label", "labels", "client_id", "__proto__", "$where",
                                      "reason\nreason: forged", "x" * 5000]),
                     TEXT.filter(lambda k: k not in MODEL_FIELDS))
    return one_file(slug, st.tuples(keys, SCALARS).map(lambda t: json.dumps({"kind": "client", "client": 0,
                                                                              t[0]: t[1]}).encode()),
                    r": Extra inputs are not permitted")


@hostile("no subject for the kind")
def _(facts, slug):
    return one_file(slug, st.tuples(st.sampled_from(["sample", "class", "client"]),
                                    st.sampled_from([{}, {"sample_ids": None}, {"label": ""}, {"client": None}])
                                    ).map(lambda t: json.dumps({"kind": t[0], **t[1]}).encode()),
                    r"^request: a (sample|class|client) request needs '(sample_ids|label|client)' \(its subject\)")


@hostile("subjects of two kinds")
def _(facts, slug):
    subjects = {"sample": live_ids(facts).map(lambda ids: {"sample_ids": ids}),
                "class": st.sampled_from(facts.live_labels).map(lambda label: {"label": label}),
                "client": st.sampled_from([0, 1]).map(lambda client: {"client": client})}
    documents = st.sampled_from(sorted(subjects)).flatmap(lambda kind: st.tuples(
        st.just(kind), subjects[kind], st.sampled_from([k for k in subjects if k != kind]).flatmap(subjects.get)))
    return one_file(slug, documents.map(lambda t: json.dumps({"kind": t[0], **t[1], **t[2]}).encode()),
                    r"^request: a (sample|class|client) request sets only '(sample_ids|label|client)'; remove")


@hostile("an empty list of sample IDs")
def _(facts, slug):
    return one_file(slug, st.sampled_from([{}, {"reason": "all of mine"}, {"request_id": f"{slug}-id"}]).map(
        lambda extra: json.dumps({"kind": "sample", "sample_ids": [], **extra}).encode()),
        r"^request: empty subject: 'sample_ids' lists no IDs")


@hostile("sample_ids that is not a list")
def _(facts, slug):
    values = st.one_of(NUMBERS, st.booleans(), st.dictionaries(TEXT, SCALARS, max_size=3),
                       st.sampled_from(facts.live_ids), TEXT.filter(bool))
    return one_file(slug, with_field({"kind": "sample"}, "sample_ids", values),
                    r"^sample_ids: Input should be a valid list")


@hostile("sample IDs that are not strings")
def _(facts, slug):
    return one_file(slug, sample_request(among_live_ids(facts, st.one_of(NUMBERS, st.booleans(), st.none(),
                                                                         STRUCTURES))),
                    r"^sample_ids\.\d+: Input should be a valid string")


ID_LIMITS = (rf"^sample_ids: \d+ sample ID\(s\) are empty, longer than {MAX_SAMPLE_ID_LENGTH} characters or contain "
             "control characters")


@hostile("blank sample IDs")
def _(facts, slug):
    return one_file(slug, sample_request(among_live_ids(facts, st.text(alphabet=" \t\r\n\u00a0\u2003\u3000",
                                                                       max_size=5))), ID_LIMITS)


@hostile("sample IDs with control or invisible characters")
def _(facts, slug):
    # Inside the ID: stripping would remove them at either end.
    invisible = st.characters(categories=("Cc", "Cf", "Zl", "Zp", "Zs")).filter(lambda c: c != " ")
    return one_file(slug, sample_request(among_live_ids(facts, st.builds(
        lambda sample_id, char, at: sample_id[:at] + char + sample_id[at:],
        st.sampled_from(facts.live_ids), invisible, st.integers(1, 6)))), ID_LIMITS)


@hostile("sample IDs longer than the limit")
def _(facts, slug):
    long_ids = st.integers(MAX_SAMPLE_ID_LENGTH + 1, 20 * MAX_SAMPLE_ID_LENGTH).map(lambda n: "digits-" + "0" * n)
    return one_file(slug, sample_request(among_live_ids(facts, long_ids)), ID_LIMITS)


@hostile("more sample IDs than the limit")
def _(facts, slug):
    def document(count: int) -> bytes:
        return body(kind="sample", sample_ids=[f"digits-{i:06d}" for i in range(count)])
    return one_file(slug, when_placed(document, st.integers(MAX_IDS_PER_REQUEST + 1, MAX_IDS_PER_REQUEST + 100)),
                    rf"^sample_ids: \d+ sample IDs in one request; the limit is {MAX_IDS_PER_REQUEST}")


REQUEST_ID_NOT_ALLOWED = r"^request_id: request_id .* is not allowed: use 1-128 characters"


@hostile("request_id with path parts")
def _(facts, slug):
    composed = st.tuples(st.lists(st.sampled_from(["..", ".", "etc", "passwd", slug]), min_size=2, max_size=6),
                         st.sampled_from(["/", "\\"])).map(lambda t: t[1].join(t[0]))
    fixed = st.sampled_from(["../outside", "../../etc/passwd", "/etc/passwd", "a/b", "..\\..\\x", "C:\\Windows\\x",
                             "./x", "..", "."])
    return one_file(slug, with_field({"kind": "client", "client": 0}, "request_id", st.one_of(fixed, composed)),
                    REQUEST_ID_NOT_ALLOWED)


@hostile("request_id outside the safe characters")
def _(facts, slug):
    unsafe = st.one_of(
        st.tuples(st.sampled_from(".-_"), SAFE_TAIL).map("".join),  # a leading dot makes a hidden file
        st.tuples(SAFE_TAIL, st.sampled_from([" ", "é", "中", "🙂", ":", "*", "\n", "\t", "%"]), SAFE_TAIL).map("".join),
        st.tuples(SAFE_TAIL, st.sampled_from(["\n", "\r\n"])).map("".join),  # a final newline: what "$" lets through
        st.integers(129, 300).map(lambda n: "r" * n),
        SAFE_TAIL.map(lambda tail: f"a..{tail}"))
    return one_file(slug, with_field({"kind": "client", "client": 0}, "request_id", unsafe), REQUEST_ID_NOT_ALLOWED)


@hostile("request_id of a wrong JSON type, false and 0 included")
def _(facts, slug):
    return one_file(slug, with_field({"kind": "client", "client": 0}, "request_id",
                                     st.one_of(st.sampled_from([0, False, [], {}]), NOT_TEXT)),
                    r"^request_id: Input should be a valid string")


@hostile("scenario name that is not a plain name")
def _(facts, slug):
    names = st.one_of(st.sampled_from(["../digits-hfl", "digits-hfl/../wine-vfl", "/digits-hfl", "digits hfl",
                                       "digits-hfl\n", ".digits-hfl", "-digits-hfl", "dígits-hfl", "~"]),
                      st.integers(65, 200).map(lambda n: "s" * n))
    return one_file(slug, with_field({"kind": "client", "client": 0}, "scenario", names),
                    r"^scenario: String should match pattern")


@hostile("scenario of a wrong JSON type")
def _(facts, slug):
    return one_file(slug, with_field({"kind": "client", "client": 0}, "scenario", NOT_TEXT),
                    r"^scenario: Input should be a valid string")


@hostile("scenario that params.yaml does not define")
def _(facts, slug):
    names = st.from_regex(r"\A[a-z][a-z0-9-]{0,20}\Z").map(lambda name: f"nope-{name}")
    return one_file(slug, with_field({"kind": "client", "client": 0}, "scenario", names),
                    r"^unknown scenario 'nope-[a-z0-9-]+'; params.yaml defines ")


@hostile("label or client as a boolean")
def _(facts, slug):
    return one_file(slug, number_field_with(st.booleans()),
                    r"^(label|client): a JSON boolean is not a number")


@hostile("label or client as text, numbers in text included")
def _(facts, slug):
    texts = st.one_of(st.integers(0, 9).map(str), st.sampled_from(["0_1", " 3 ", "3.0", "three", "0x1", "٣"]),
                      TEXT.filter(bool))
    return one_file(slug, number_field_with(texts), r"^(label|client): a JSON string is not a number")


@hostile("label or client as a list or object")
def _(facts, slug):
    return one_file(slug, number_field_with(STRUCTURES), r"^(label|client): Input should be a valid integer")


@hostile("fractional label or client")
def _(facts, slug):
    return one_file(slug, number_field_with(FRACTIONS),
                    r"^(label|client): Input should be a valid integer, got a number with a fractional part")


@hostile("submitted_at that is not a time")
def _(facts, slug):
    times = st.one_of(st.from_regex(r"\A[a-z ]{1,20}\Z"), st.booleans(), STRUCTURES,
                      st.sampled_from(["2025-13-45", "2025-02-30", "yesterday", "12:00", "2025-01-01T25:00:00"]))
    return one_file(slug, with_field({"kind": "client", "client": 0}, "submitted_at", times),
                    r"^submitted_at: Input should be a valid datetime")


@hostile("submitted_at outside the representable range")
def _(facts, slug):
    times = st.one_of(st.sampled_from(["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59",
                                       "0000-01-01T00:00:00Z"]),
                      st.integers(10**17, 10**300), st.integers(-10**300, -10**15), st.floats(1e17, 1e300))
    return one_file(slug, with_field({"kind": "client", "client": 0}, "submitted_at", times),
                    r"^submitted_at: .*(out of range|not supported)")


@hostile("deadline with no UTC form")
def _(facts, slug):
    # Valid ISO 8601 with an offset, but year 10000 or year 0 once converted to UTC: comparable with nothing.
    times = st.sampled_from(["9999-12-31T23:59:59-23:59", "9999-12-31T12:00:00-12:30", "0001-01-01T00:00:00+01:00",
                             "0001-01-01T00:30:00+23:59"])
    return one_file(slug, with_field({"kind": "client", "client": 0}, "deadline", times),
                    r"^deadline: .* is out of range once converted to UTC")


@hostile("deadline not after submission")
def _(facts, slug):
    submitted = datetime(2025, 6, 1, tzinfo=timezone.utc)
    times = st.one_of(st.just("0001-01-01T00:00:00Z"), st.datetimes(max_value=datetime(2025, 6, 1),
                                                                      timezones=st.just(timezone.utc)).map(
        lambda t: t.isoformat()))
    return one_file(slug, with_field({"kind": "client", "client": 0, "submitted_at": submitted.isoformat()},
                                     "deadline", times),
                    r"^deadline: .* is not after the request was submitted")


@hostile("deadline given as a number")
def _(facts, slug):
    numbers = st.one_of(st.integers(-10**12, 10**12), st.floats(-1e12, 1e12, allow_nan=False),
                        st.integers(0, 10**12).map(str))
    return one_file(slug, with_field({"kind": "client", "client": 0}, "deadline", numbers),
                    r"^deadline: .* is a number, not a date")


@hostile("reason longer than 2000 characters")
def _(facts, slug):
    def document(char: str, length: int) -> bytes:
        return body(kind="client", client=0, reason=char * length)
    return one_file(slug, when_placed(document, PRINTABLE, st.integers(2001, 20_000)),
                    r"^reason: String should have at most 2000 characters")


@hostile("reason of a wrong JSON type")
def _(facts, slug):
    return one_file(slug, with_field({"kind": "client", "client": 0}, "reason", NOT_TEXT),
                    r"^reason: Input should be a valid string")


@hostile("lone UTF-16 surrogates in a field or key")
def _(facts, slug):
    surrogate = st.characters(categories=("Cs",))

    def document(where: str, char: str) -> bytes:
        fields = {"kind": "client", "client": 0}
        key, value = (char, 1) if where == "key" else (where, f"x{char}")
        return json.dumps({**fields, key: value}).encode()  # ensure_ascii: the file says \udXXX
    # Pydantic refuses them where it must measure or match the text; request_id's own check refuses the rest.
    return one_file(slug, st.builds(document, st.sampled_from(["kind", "reason", "scenario", "request_id", "key"]),
                                    surrogate),
                    r"Input should be a valid string, unable to parse raw data as a unicode|^request_id: request_id "
                    r"'x\\ud[89a-f][0-9a-f]{2}' is not allowed")


# --- the subject against the data version -----------------------------------------------------

UNKNOWN_IDS = r"^unknown sample IDs, not in data version [0-9a-f]+ of digits-hfl"


@hostile("sample IDs unknown to the data version")
def _(facts, slug):
    unknown = st.one_of(st.integers(10**5, 10**6 - 1).map(lambda n: f"digits-{n}"),
                        st.sampled_from(["wine-00001", "mnist5k-00001", "breast_cancer-00001", "digits-"]),
                        st.text(alphabet=PRINTABLE, max_size=20).map(lambda text: f"nope-{text}"))
    return one_file(slug, sample_request(st.lists(unknown, min_size=1, max_size=30)), UNKNOWN_IDS)


@hostile("sample IDs that look like paths")
def _(facts, slug):
    paths = st.one_of(st.sampled_from(["../../etc/passwd", "/etc/shadow", "..\\..\\windows\\win.ini", "C:\\x",
                                       "~/.ssh/id_rsa", "file:///etc/passwd", "data/raw/digits/sample_ids.npy",
                                       f"{facts.live_ids[0]}/../{facts.live_ids[1]}", "%2e%2e%2fetc%2fpasswd"]),
                      st.lists(st.sampled_from(["..", "etc", "passwd", "data"]), min_size=2, max_size=5)
                      .map("/".join))
    return one_file(slug, sample_request(st.lists(paths, min_size=1, max_size=5)), UNKNOWN_IDS)


def look_alike(sample_id: str, how: str) -> str:
    if how == "full-width digits":
        return "".join(chr(ord(c) + 0xFEE0) if c.isdigit() else c for c in sample_id)
    if how == "cyrillic i":
        return sample_id.replace("i", "\u0456")
    if how == "combining accent":
        return sample_id + "\u0301"
    return sample_id.upper()


@hostile("look-alike sample IDs: full-width digits, Cyrillic letters, combining marks, other case")
def _(facts, slug):
    return one_file(slug, sample_request(st.lists(st.builds(
        look_alike, st.sampled_from(facts.live_ids),
        st.sampled_from(["full-width digits", "cyrillic i", "combining accent", "upper case"])), min_size=1,
        max_size=5)), UNKNOWN_IDS)


@hostile("sample IDs an earlier request deleted")
def _(facts, slug):
    return one_file(slug, sample_request(st.lists(st.sampled_from(facts.deleted_ids), min_size=1, max_size=5,
                                                  unique=True)),
                    rf"^already deleted \(listed in {re.escape(LEDGER_PATH.as_posix())}\)")


@hostile("known sample IDs mixed with an unknown one")
def _(facts, slug):
    return one_file(slug, sample_request(among_live_ids(facts, st.sampled_from(["digits-999999", "nope"]))),
                    UNKNOWN_IDS)


@hostile("class label out of range")
def _(facts, slug):
    labels = st.one_of(st.integers(facts.num_classes, 10**6), st.integers(10**18, 10**300))
    return one_file(slug, labels.map(lambda label: body(kind="class", label=label)),
                    rf"^class \d+ is out of range: digits-hfl has classes 0\.\.{facts.num_classes - 1}$")


@hostile("negative class label")
def _(facts, slug):
    return one_file(slug, st.integers(-10**300, -1).map(lambda label: body(kind="class", label=label)),
                    r"^class -\d+ is out of range: digits-hfl has classes")


@hostile("client index out of range")
def _(facts, slug):
    clients = st.one_of(st.integers(facts.num_clients, 10**6), st.integers(10**18, 10**300))
    return one_file(slug, clients.map(lambda client: body(kind="client", client=client)),
                    rf"^unknown client \d+: digits-hfl has clients 0\.\.{facts.num_clients - 1}$")


@hostile("negative client index")
def _(facts, slug):
    return one_file(slug, st.integers(-10**300, -1).map(lambda client: body(kind="client", client=client)),
                    r"^unknown client -\d+: digits-hfl has clients")


@hostile("a client with nothing left to delete")
def _(facts, slug):
    return one_file(slug, st.sampled_from([{}, {"reason": "again"}]).map(
        lambda extra: json.dumps({"kind": "client", "client": 2, **extra}).encode()),
        r"^client 2 has no remaining training samples in digits-hfl: already deleted")


@hostile("one request_id for two different requests")
def _(facts, slug):
    # The first file (in name order) makes the request; the second, with another subject, is rejected.
    def pair(ids: list[str], label: int) -> list[InboxFile]:
        shared = f"{slug}-shared"
        return [InboxFile(f"{slug}-a.json", body(kind="sample", sample_ids=ids, request_id=shared),
                          request_id=shared, deletes=tuple(ids)),
                InboxFile(f"{slug}-b.json", body(kind="class", label=label, request_id=shared),
                          reason=rf"^request_id {shared} is also used by {slug}-a\.json for another subject")]
    return st.builds(pair, live_ids(facts), st.integers(0, facts.num_classes - 1))


@hostile("request_id of an applied request reused for another subject")
def _(facts, slug):
    subjects = st.one_of(live_ids(facts).map(lambda ids: {"kind": "sample", "sample_ids": ids}),
                         st.integers(0, 9).map(lambda label: {"kind": "class", "label": label}),
                         st.sampled_from([0, 1]).map(lambda client: {"kind": "client", "client": client}))
    return one_file(slug, subjects.map(lambda s: json.dumps({**s, "request_id": APPLIED}).encode()),
                    rf"^request_id {APPLIED} was already applied in batch \S+ to another subject")


# --- names and kinds of inbox entries (a valid request inside: only the entry stops it) ---------

VALID_INSIDE = body(kind="client", client=0)
BAD_NAME_CHARACTERS = r"^file name must be 1-128 characters from A-Z a-z 0-9 \. _ -"


def named(names: st.SearchStrategy, reason: str) -> st.SearchStrategy[list[InboxFile]]:
    return names.map(lambda name: [InboxFile(name, VALID_INSIDE, reason=reason)])


@hostile("hidden file")
def _(facts, slug):
    return named(SAFE_TAIL.map(lambda tail: f".{slug}-{tail}.json"), r"^hidden file \(name starts with '\.'\)")


@hostile("file name with '..'")
def _(facts, slug):
    return named(st.builds(lambda form, tail: form.format(slug=slug, tail=tail),
                           st.sampled_from(["{slug}..{tail}.json", "{slug}...json", "{slug}-..-{tail}.json",
                                            "{slug}.json..json", "{slug}-{tail}...json"]), SAFE_TAIL),
                 r"^file name contains '\.\.': not read")


@hostile("percent-encoded path traversal in the file name")
def _(facts, slug):
    return named(st.sampled_from([f"..%2F..%2F{slug}.json", f"%2e%2e%2f%2e%2e%2f{slug}.json",
                                  f"{slug}%2F..%2F..%2Fetc%2Fpasswd.json", f"..%5C..%5C{slug}.json",
                                  f"%c0%ae%c0%ae%c0%af{slug}.json", f"%252e%252e%252f{slug}.json"]),
                 rf"^hidden file|^file name contains '\.\.'|{BAD_NAME_CHARACTERS}")


@hostile("a suffix other than .json")
def _(facts, slug):
    return named(st.sampled_from(["", ".txt", ".JSON", ".json.bak", ".json~", ".jsonl", ".json.", ".json ",
                                  ".reason.txt", ".json\n"]).map(lambda suffix: f"{slug}{suffix}"),
                 r"^not a \.json file: request files are named <request_id>\.json")


@hostile("file name with spaces, shell metacharacters or non-ASCII")
def _(facts, slug):
    return named(st.builds(lambda char, tail: f"{slug}{char}{tail}.json",
                           st.sampled_from(list(" $`;|&*?<>'\"()[]{}!#~=+,@é中🙂")), SAFE_TAIL), BAD_NAME_CHARACTERS)


@hostile("file name with control characters")
def _(facts, slug):
    controls = st.characters(categories=("Cc",)).filter(lambda c: c not in "\x00/")
    return named(st.builds(lambda char, tail: f"{slug}{char}{tail}.json", controls, SAFE_TAIL), BAD_NAME_CHARACTERS)


@hostile("file name longer than 128 characters")
def _(facts, slug):
    # The longest stem Linux allows (255 bytes with ".json") and shorter ones past the limit.
    return named(st.integers(129, 250).map(lambda n: f"{slug}-" + "n" * (n - len(slug) - 1) + ".json"),
                 BAD_NAME_CHARACTERS)


@hostile("file name that is not UTF-8")
def _(facts, slug):
    return named(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80", b"\xfe\xfe"]).map(
        lambda raw: slug.encode() + raw + b".json"), BAD_NAME_CHARACTERS)


@hostile("Windows path in the file name")
def _(facts, slug):
    return named(st.sampled_from([f"{slug}\\..\\..\\x.json", f"C:\\{slug}.json", f"{slug}\\etc\\passwd.json",
                                  f"\\\\server\\share\\{slug}.json"]),
                 rf"^file name contains '\.\.'|{BAD_NAME_CHARACTERS}")


SYMLINK = r"^symbolic link: not followed; put the request file itself into the inbox"


def links(slug: str, targets: st.SearchStrategy[str]) -> st.SearchStrategy[list[InboxFile]]:
    return targets.map(lambda target: [InboxFile(f"{slug}.json", node="symlink", target=target, reason=SYMLINK)])


@hostile("symbolic link to a request outside the inbox")
def _(facts, slug):
    request = facts.outside / "request.json"
    return links(slug, st.sampled_from([str(request), os.path.relpath(request, facts.inbox), "/etc/passwd"]))


@hostile("symbolic link to a directory")
def _(facts, slug):
    return links(slug, st.sampled_from([str(facts.outside), "/", "..", str(facts.root)]))


@hostile("dangling or looping symbolic link")
def _(facts, slug):
    return links(slug, st.sampled_from(["missing.json", "../../nowhere/x.json", f"{slug}.json"]))


@hostile("directory named like a request")
def _(facts, slug):
    return st.just([InboxFile(f"{slug}.json", VALID_INSIDE, node="directory",
                              reason=r"^not a regular file \(a directory or a device\)")])


@hostile("named pipe (FIFO) named like a request")
def _(facts, slug):
    # A reader that opened it would wait forever for a writer.
    return st.just([InboxFile(f"{slug}.json", node="fifo", reason=r"^not a regular file \(a directory or a device\)")])


@hostile("hard link to a file outside the inbox")
def _(facts, slug):
    return st.just([InboxFile(f"{slug}.json", node="hardlink", target=str(facts.outside / "secret.txt"),
                              reason=r"^malformed JSON: ")])


# --- hostile but valid: processed, each ID deleted once -----------------------------------------

def processed(name: str, document: dict, request_id: str, deletes: tuple[str, ...] = ()) -> InboxFile:
    return InboxFile(name, json.dumps(document).encode(), request_id=request_id, deletes=deletes)


@hostile("duplicate IDs within one file (counted once)", rejected=False)
def _(facts, slug):
    return live_ids(facts).map(lambda ids: [processed(f"{slug}.json", {"kind": "sample", "sample_ids": ids + ids[::-1]},
                                                      slug, tuple(ids))])


@hostile("duplicate IDs across files (merged: each deleted once)", rejected=False)
def _(facts, slug):
    def pair(ids: list[str]) -> list[InboxFile]:
        first, second = ids[:len(ids) // 2 + 1], ids[len(ids) // 2:]
        return [processed(f"{slug}-a.json", {"kind": "sample", "sample_ids": first}, f"{slug}-a", tuple(first)),
                processed(f"{slug}-b.json", {"kind": "sample", "sample_ids": second}, f"{slug}-b", tuple(second))]
    return live_ids(facts, 2, 8).map(pair)


@hostile("the same request in two files (one ledger entry)", rejected=False)
def _(facts, slug):
    return live_ids(facts).map(lambda ids: [
        processed(f"{slug}-{copy}.json", {"kind": "sample", "sample_ids": ids, "request_id": slug}, slug, tuple(ids))
        for copy in "ab"])


@hostile("replay of an applied request (filed, not applied again)", rejected=False)
def _(facts, slug):
    return st.just([processed(f"{slug}.json", {"kind": "client", "client": 2, "request_id": APPLIED}, APPLIED)])


@hostile("sample IDs padded with whitespace (trimmed)", rejected=False)
def _(facts, slug):
    padded = st.tuples(live_ids(facts), st.sampled_from([" ", "\t", "\n ", "\u3000"]))
    return padded.map(lambda t: [processed(f"{slug}.json", {"kind": "sample", "sample_ids": [
        t[1] + i + t[1] for i in t[0]]}, slug, tuple(t[0]))])


def valid_requests(facts: DataFacts) -> st.SearchStrategy[list[InboxFile]]:
    subjects = st.one_of(
        live_ids(facts, 1, 8).map(lambda ids: ({"kind": "sample", "sample_ids": ids}, tuple(ids))),
        st.sampled_from(facts.live_labels).map(lambda label: ({"kind": "class", "label": label}, ())),
        st.sampled_from([0, 1]).map(lambda client: ({"kind": "client", "client": client}, ())))
    return st.lists(subjects, min_size=1, max_size=4).map(lambda chosen: [
        processed(f"valid-{i}.json", document, f"valid-{i}", deletes) for i, (document, deletes) in enumerate(chosen)])


# --- workspace, inbox and outcome -------------------------------------------------------------

def stage_history(root: Path, outside: Path) -> DataFacts:
    """Put APPLIED (all of client 2) into the ledger, and the targets of links out of the inbox
    beside the workspace; returns what generated requests can refer to."""
    catalog = load_catalog(SCENARIO, root, set())
    by_client = {c: [i for i, owner in catalog.owners.items() if owner == c] for c in catalog.clients}
    applied = LedgerEntry(request_id=APPLIED, batch_id="batch-earlier", scenario=SCENARIO, kind="client",
                          subject={"client": 2}, sample_ids=by_client[2], clients={"2": by_client[2]})
    ledger = applied.model_dump_json(exclude_none=True) + "\n"
    (root / LEDGER_PATH).write_text(ledger)
    (outside / "folder").mkdir(parents=True)
    (outside / "request.json").write_bytes(OUTSIDE_REQUEST)
    (outside / "secret.txt").write_bytes(OUTSIDE_SECRET)
    settled = time.time() - 86400  # a hard link shares the target's time: finished files, not ones being written
    os.utime(outside / "secret.txt", (settled, settled))
    live = by_client[0] + by_client[1]
    return DataFacts(root, outside, ledger, tuple(live), tuple(by_client[2]),
                     tuple(sorted({catalog.labels[i] for i in live})), catalog.num_classes, len(catalog.clients))


def empty_request_folders(facts: DataFacts) -> RequestFolders:
    """Empty inbox, processed/ and quarantine/, and the ledger as staged: one generated inbox each."""
    folders = RequestFolders.create(facts.root)
    for directory in (folders.inbox, folders.processed, folders.quarantine):
        with os.scandir(directory) as entries:
            for entry in entries:
                shutil.rmtree(entry.path) if entry.is_dir(follow_symlinks=False) else os.unlink(entry.path)
    (facts.root / LEDGER_PATH).write_text(facts.ledger)
    return folders


def place(inbox: Path, file: InboxFile) -> None:
    path = os.path.join(os.fsencode(inbox), os.fsencode(file.name))  # bytes: for names that are not UTF-8
    if file.node == "file":
        with open(path, "wb") as handle:
            handle.write(file.payload())
        # A finished file: one that changed within the inbox's grace period may still be being written.
        settled = time.time() - 86400
        os.utime(path, (settled, settled))
    elif file.node == "directory":
        os.mkdir(path)
        with open(os.path.join(path, b"request.json"), "wb") as handle:
            handle.write(file.payload())
    elif file.node == "fifo":
        os.mkfifo(path)
    elif file.node == "symlink":
        os.symlink(os.fsencode(file.target), path)
    elif file.node == "hardlink":
        os.link(os.fsencode(file.target), path)
    else:
        raise ValueError(f"unknown inbox entry {file.node!r}")


def ingest_without_orchestration(root: Path) -> None:
    """The data-plane steps of ``ingest-deletions``, in its order, up to the ledger: the new data
    version and the erasure check are the flow test's."""
    folders = RequestFolders.create(root)
    ws = Workspace.open(root)
    inbox = read_inbox(ws, SCENARIO)
    for item in inbox.applied:
        file_processed(folders, item)
    plan = validate_requests.fn(ws, SCENARIO, inbox.pending)
    for rejection in inbox.rejected + plan.rejected:
        for item in rejection.items:
            quarantine(folders, item, rejection.reason)
    Ledger(root / LEDGER_PATH).append(plan.entries)
    accepted = {entry.request_id for entry in plan.entries}
    for waiting in inbox.pending:
        if waiting.request.request_id in accepted:
            for item in waiting.items:
                file_processed(folders, item)


@dataclass(frozen=True)
class Quarantined:
    reason: str
    entry: Path


def read_quarantine(folders: RequestFolders) -> dict[str, Quarantined]:
    """Original name -> reason and quarantined entry, from the reason files. A reason file is
    ``<entry>.reason.txt`` beside its entry (an input may itself be named ``x.reason.txt``)."""
    names = set(os.listdir(folders.quarantine))
    found: dict[str, Quarantined] = {}
    for name in sorted(names):
        entry = name.removesuffix(REASON_SUFFIX)
        if entry == name or entry not in names:
            continue
        lines = (folders.quarantine / name).read_text(encoding="utf-8").splitlines()
        # Exactly the lines quarantine() writes: nothing taken from a file may add or forge one.
        assert [line.partition(": ")[0] for line in lines] == REASON_FILE_KEYS, lines
        fields = dict(line.split(": ", 1) for line in lines)
        original = ast.literal_eval(fields["file"])
        assert original not in found, f"{original!r} quarantined twice"
        found[original] = Quarantined(fields["reason"], folders.quarantine / entry)
    assert len(names) == 2 * len(found), "an entry in quarantine/ without its reason file"
    return found


def check_every_file_filed(facts: DataFacts, files: list[InboxFile]) -> int:
    """Every input is in exactly one of processed/ and quarantine/, as its class demands; valid
    requests are in the ledger, each ID deleted once; nothing outside the inbox changed. Returns the
    number of inputs lost (in neither place)."""
    folders = RequestFolders(facts.root)
    processed_names = set(os.listdir(folders.processed))
    quarantined = read_quarantine(folders)
    names = [file.scanned_name for file in files]
    assert len(set(names)) == len(names)
    lost = sum(name not in processed_names and name not in quarantined for name in names)
    assert os.listdir(folders.inbox) == []
    assert processed_names == {f.scanned_name for f in files if f.reason is None}
    for file in files:
        if file.reason is not None:
            filed = quarantined[file.scanned_name]
            assert re.search(file.reason, filed.reason), (file.scanned_name, filed.reason)
            assert os.path.lexists(filed.entry)
    assert set(quarantined) == {f.scanned_name for f in files if f.reason is not None}

    entries = Ledger(facts.root / LEDGER_PATH).entries()
    by_request = {entry.request_id: entry for entry in entries}
    assert len(by_request) == len(entries), "a request in the ledger twice"
    assert set(by_request) == {APPLIED} | {f.request_id for f in files if f.reason is None}
    deleted = [i for entry in entries for i in entry.sample_ids]
    assert len(deleted) == len(set(deleted)), "a sample deleted twice"
    for file in files:
        if file.deletes:
            entry = by_request[file.request_id]
            assert set(entry.sample_ids) | set(entry.merged_ids) == set(file.deletes), file.scanned_name

    assert (facts.outside / "request.json").read_bytes() == OUTSIDE_REQUEST
    assert (facts.outside / "secret.txt").read_bytes() == OUTSIDE_SECRET
    assert (facts.outside / "folder").is_dir()
    return lost


def report(reliability_report, files: list[InboxFile], facts: DataFacts, lost: int) -> None:
    for hostile_class in CATALOGUE:
        if hostile_class.rejected:
            reliability_report.cover(hostile_class.name)
    reliability_report.count("bad input files tried", sum(f.reason is not None for f in files))
    reliability_report.count("hostile but valid files tried", sum(
        f.reason is None and not f.scanned_name.startswith("valid-") for f in files))
    reliability_report.count("valid requests processed", len(Ledger(facts.root / LEDGER_PATH).entries()) - 1)
    reliability_report.count("requests lost", lost)


# --- tests -----------------------------------------------------------------------------------

def test_the_catalogue_holds_at_least_forty_distinct_classes_of_bad_input():
    assert len({c.name for c in CATALOGUE}) == len({c.slug for c in CATALOGUE}) == len(CATALOGUE)
    assert sum(c.rejected for c in CATALOGUE) >= 40


@pytest.fixture(scope="module")
def hostile_workspace(tmp_path_factory) -> DataFacts:
    """One prepared digits-hfl workspace for the generated inboxes: they never make a new data
    version, so preparing it once saves time."""
    base = tmp_path_factory.mktemp("hostile")
    root = init_workspace(base / "workspace")
    reproduce(root, SCENARIO)
    return stage_history(root, base / "outside")


@settings(max_examples=GENERATED_INBOXES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(data=st.data())
def test_generated_bad_files_are_quarantined_with_their_reason_and_valid_ones_processed(
        hostile_workspace, reliability_report, data):
    facts = hostile_workspace
    folders = empty_request_folders(facts)
    files = []
    for hostile_class in CATALOGUE:
        files += data.draw(hostile_class.variants(facts, hostile_class.slug), label=hostile_class.name)
    files += data.draw(valid_requests(facts), label="valid requests")
    for file in files:
        place(folders.inbox, file)

    ingest_without_orchestration(facts.root)

    lost = check_every_file_filed(facts, files)
    reliability_report.count("generated inboxes", 1)
    report(reliability_report, files, facts, lost)
    assert lost == 0


def representative(hostile_class: HostileClass, facts: DataFacts) -> list[InboxFile]:
    """The first variant Hypothesis generates for a class: its simplest, unless a filter refuses
    that one (the seed keeps it the same from run to run)."""
    return find(hostile_class.variants(facts, hostile_class.slug), lambda _: True, random=Random(0),
                settings=settings(max_examples=1, phases=[Phase.generate], database=None))


def test_one_of_every_class_with_valid_requests_through_the_ingest_flow(workspace, prefect_server, tmp_path,
                                                                        reliability_report):
    reproduce(workspace, SCENARIO)
    facts = stage_history(workspace, tmp_path / "outside")
    files = [file for hostile_class in CATALOGUE for file in representative(hostile_class, facts)]
    valid = [processed("valid-sample.json", {"kind": "sample", "sample_ids": list(facts.live_ids[:7])},
                       "valid-sample", facts.live_ids[:7]),
             processed("valid-client.json", {"kind": "client", "client": 1}, "valid-client")]
    folders = RequestFolders.create(workspace)
    for file in files + valid:
        place(folders.inbox, file)

    result = ingest.ingest_deletions(scenario=SCENARIO, root=str(workspace))

    assert result.status == "complete" and result.erasure.verified
    assert len(result.quarantined) == sum(f.reason is not None for f in files)
    assert result.already_applied == [f.scanned_name for f in files if f.request_id == APPLIED]
    lost = check_every_file_filed(facts, files + valid)
    report(reliability_report, files + valid, facts, lost)
    assert lost == 0


def test_acceptance_traversal_name_malformed_and_valid_file_together(trained_digits_hfl, prefect_server, capsys,
                                                                      reliability_report):
    """Through the entry point a user runs: ``fedunlearn process``, in a workspace where `fedunlearn
    train --scenario digits-hfl --inline` ran (a copy of the session's). The traversal name (what
    ``../../../etc/passwd.json`` becomes once URL-encoded, the only way a name can hold it) carries
    a valid request for other samples: only its name may stop it."""
    workspace = trained_digits_hfl

    def cli(*args: str) -> str:
        assert main(["--root", str(workspace), *args]) == 0
        return capsys.readouterr().out

    wanted = cli("ids", "--scenario", SCENARIO, "--client", "1", "--limit", "6").split()
    others = cli("ids", "--scenario", SCENARIO, "--client", "0", "--limit", "6").split()
    folders = RequestFolders.create(workspace)
    traversal = "..%2F..%2F..%2Fetc%2Fpasswd.json"
    (folders.inbox / traversal).write_text(json.dumps({"kind": "sample", "sample_ids": others}))
    (folders.inbox / "malformed.json").write_text('{"kind": "sample", "sample_ids": ["' + others[0])
    os.utime(folders.inbox / "malformed.json", (time.time() - 3600, time.time() - 3600))  # written an hour ago
    (folders.inbox / "valid.json").write_text(json.dumps({"kind": "sample", "sample_ids": wanted}))

    out = cli("process", "--scenario", SCENARIO)

    assert os.listdir(folders.inbox) == [] and os.listdir(folders.processed) == ["valid.json"]
    entries = Ledger(workspace / LEDGER_PATH).entries()
    assert [e.request_id for e in entries] == ["valid"] and sorted(entries[0].sample_ids) == sorted(wanted)
    quarantined = read_quarantine(folders)
    assert sorted(quarantined) == sorted([traversal, "malformed.json"])
    assert quarantined[traversal].reason == "hidden file (name starts with '.'): not read"
    assert quarantined["malformed.json"].reason.startswith("malformed JSON: Unterminated string")
    moved = quarantined[traversal].entry
    assert moved.parent == folders.quarantine and ".." not in moved.name and not moved.name.startswith(".")
    assert not (workspace.parent / "etc").exists()
    assert f"quarantined {traversal!r}: hidden file" in out and "quarantined 'malformed.json': malformed JSON" in out
    assert "receipt: data/receipts/" in out  # the valid request was forgotten by a model, not only deleted
    reliability_report.count("acceptance: requests processed", len(entries))
    reliability_report.count("acceptance: files quarantined", len(quarantined))
