"""Erasure verification: show that the deleted samples' bytes are gone, not just their IDs.

Before a batch produces the new data version, each deleted sample's feature rows are read *as
stored* (the prepared ``features.npy`` and every partition file holding the sample) and kept in
memory only, as fingerprints. After the new version (and the optional purge of the DVC cache) every
file of every store in scope (``Store``: a named set of directories the product writes) is read once
and searched for every fingerprint: as raw bytes, in the dtypes a copy of the row is likely written
in (``row_variants``), and in text files also as the numbers the text writes. Rows deleted by
*earlier* batches, whose bytes are gone, are checked by keyed fingerprints (``ErasedRows``:
HMAC-SHA256 under a secret key of the workspace) against every row of every array file in scope.

Why: a copy of a row (an MLflow ``input_example.json``, a cached earlier data version) outlives the
deletion of its ID, so only a search for its bytes shows it gone — and the report never vouches for
what it did not read. Stores out of scope are listed with the reason; a fingerprint that would prove nothing (a
row with too little content, or identical to a retained sample's row) makes its sample "not
verifiable"; the report is ``verified`` only when at least one sample could be checked and no store
in scope holds a deleted row, and otherwise names the store and file that do. The stores, the
dtypes and the text formats searched: docs/requests-and-ledger.md, "Ingest", and DESIGN.md §6.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
from pydantic import BaseModel

from fedunlearn.data.store import PARTITIONS_DIR, RAW_DIR

MIN_CONTENT_BYTES = 16  # non-zero bytes a row needs to be recognisable (a float32 row of 4+ values)


@dataclass
class RowSource:
    """Feature rows as stored in one place, with their sample IDs."""

    name: str
    sample_ids: list[str]
    rows: np.ndarray  # 2-D: one flattened row per sample, dtype and byte order as stored

    @property
    def dtype(self) -> np.dtype:
        return self.rows.dtype

    @classmethod
    def from_arrays(cls, name: str, sample_ids: np.ndarray, features: np.ndarray,
                    only: set[str] | None = None) -> "RowSource":
        ids = sample_ids.tolist()
        rows = np.ascontiguousarray(features).reshape(len(ids), int(np.prod(features.shape[1:])))
        if only is not None:
            keep = [k for k, sid in enumerate(ids) if sid in only]
            ids, rows = [ids[k] for k in keep], rows[keep]
        return cls(name, ids, rows)


def stored_row_sources(root: Path, dataset: str, scenarios: list[str]) -> list[RowSource]:
    """The prepared dataset and every split (client, party, test) of the scenarios' partitions."""
    root = Path(root)
    directories = [root / RAW_DIR / dataset]
    for scenario in scenarios:
        base = root / PARTITIONS_DIR / scenario
        if base.is_dir():
            directories += sorted(d for d in base.iterdir() if d.is_dir())
    sources = []
    for directory in directories:
        ids, features = directory / "sample_ids.npy", directory / "features.npy"
        if ids.is_file() and features.is_file():
            sources.append(RowSource.from_arrays(directory.relative_to(root).as_posix(),
                                                 np.load(ids, allow_pickle=False),
                                                 np.load(features, allow_pickle=False)))
    return sources


@dataclass
class Fingerprints:
    """The deleted samples' row bytes (memory only) and the samples that cannot be checked."""

    by_sample: dict[str, set[bytes]]  # each row as stored and in the dtypes a copy is likely written in
    not_verifiable: dict[str, str]
    dtypes: set[str] = field(default_factory=set)  # how the rows are stored: text numbers are decoded to these
    stored: dict[str, set[bytes]] = field(default_factory=dict)  # each row as little-endian float32: keyed later

    def sample_ids(self) -> set[str]:
        return set(self.by_sample) | set(self.not_verifiable)

    def digest(self) -> bytes:
        """Names these fingerprints (the rows and how they are stored), e.g. to remember what a scan for
        them found clean."""
        rows = hashlib.blake2b(digest_size=16)
        for row in sorted(r for found in self.by_sample.values() for r in found):
            rows.update(_digest(row))
        rows.update(",".join(sorted(self.dtypes)).encode())
        return rows.digest()


def _digest(row: bytes) -> bytes:
    return hashlib.blake2b(row, digest_size=16).digest()


def row_variants(row: np.ndarray) -> set[bytes]:
    """The bytes of ``row`` as stored and as a copy of it would likely be written: float32 (what the
    project writes) and float64; an image row on the 8-bit grid (values k/255) also as its uint8 pixels
    and as those over 255 in float64; a row of small integers as uint8. Variants too short or too empty
    to recognise are left out."""
    values = row.astype("<f8")
    variants = {row.tobytes(), row.astype("<f4").tobytes(), values.tobytes()}
    pixels = np.round(values * 255.0)
    if values.min() >= 0.0 and values.max() <= 1.0 and np.allclose(values * 255.0, pixels, rtol=0, atol=1e-3):
        variants |= {pixels.astype(np.uint8).tobytes(), (pixels / 255.0).tobytes()}
    if values.min() >= 0.0 and values.max() <= 255.0 and np.array_equal(values, np.round(values)):
        variants.add(values.astype(np.uint8).tobytes())
    return {v for v in variants if len(v) >= RowMatcher.ANCHOR_BYTES and _distinctive(v)}


def _distinctive(row: bytes) -> bool:
    return np.count_nonzero(np.frombuffer(row, dtype=np.uint8)) >= MIN_CONTENT_BYTES


def take_fingerprints(sources: list[RowSource], deleted: set[str]) -> Fingerprints:
    rows: dict[str, dict[bytes, np.ndarray]] = {sample_id: {} for sample_id in deleted}
    retained: set[bytes] = set()  # digests, not rows: a large dataset stays cheap to hold
    dtypes = {source.dtype.str for source in sources if source.sample_ids}
    for source in sources:
        for index, sample_id in enumerate(source.sample_ids):
            row = source.rows[index].tobytes()
            if sample_id in rows:
                rows[sample_id][row] = source.rows[index]
            else:
                retained.add(_digest(row))
    fingerprints = Fingerprints({}, {}, dtypes)
    for sample_id in sorted(rows):
        distinctive = {r: v for r, v in rows[sample_id].items() if _distinctive(r)}
        unique = [v for r, v in distinctive.items() if _digest(r) not in retained]
        if unique:
            fingerprints.by_sample[sample_id] = set().union(*(row_variants(v) for v in unique))
            fingerprints.stored[sample_id] = {v.astype("<f4").tobytes() for v in unique}
        elif distinctive:
            fingerprints.not_verifiable[sample_id] = "its row is identical to a retained sample's row"
        elif rows[sample_id]:
            fingerprints.not_verifiable[sample_id] = "its row is almost all zero bytes: nothing to recognise"
        else:
            fingerprints.not_verifiable[sample_id] = "its row was not found in the data before deletion"
    return fingerprints


# The keyed fingerprints of deleted rows, append-only next to the ledger (no DVC stage depends on it),
# and the key, in the workspace but outside every store the scan reads or a push sends.
ERASED_ROWS_PATH = Path("data/ledger/erased-rows.jsonl")
FINGERPRINT_KEY_PATH = Path(".fedunlearn/fingerprint.key")
ARRAY_SUFFIXES = (".npy", ".npz")


def fingerprint_key(root: Path) -> bytes:
    """The workspace's secret fingerprint key, created (random, 32 bytes, owner-only) on first use."""
    path = Path(root) / FINGERPRINT_KEY_PATH
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it first: use theirs
            return path.read_bytes()
        with os.fdopen(descriptor, "wb") as out:
            out.write(secrets.token_bytes(32))
            out.flush()
            os.fsync(out.fileno())
    return path.read_bytes()


def key_id(key: bytes) -> str:
    """Names a key without revealing it: which fingerprints it can check."""
    return hashlib.sha256(b"fedunlearn fingerprint key id\0" + key).hexdigest()[:16]


def keyed_digest(key: bytes, row: bytes) -> bytes:
    return hmac.new(key, row, hashlib.sha256).digest()


@dataclass
class ErasedRows:
    """Keyed fingerprints of the rows earlier batches deleted, so that a later scan can tell whether
    one is back in a store — without keeping the row, which would defeat its deletion.

    What is kept, per deleted row: its sample ID, its length (number of values) and
    HMAC-SHA256(key, the row's float32 bytes), in ``data/ledger/erased-rows.jsonl``. It is not the data:
    a keyed one-way digest cannot be inverted, and without the key (``.fedunlearn/fingerprint.key``,
    never scanned, pushed nor snapshotted) it cannot even be tested against a guessed row; deleting the
    key makes every fingerprint useless. A workspace restored elsewhere has another key: the
    fingerprints made under the old one are counted as not checkable (``other_key``), not trusted."""

    key: bytes
    owners: dict[bytes, str] = field(default_factory=dict)  # keyed digest -> sample ID
    lengths: set[int] = field(default_factory=set)  # row lengths (values) to hash: other arrays are skipped
    other_key: int = 0  # fingerprints made under a key this workspace does not hold

    @classmethod
    def load(cls, root: Path, key: bytes, without: set[str] = frozenset()) -> "ErasedRows":
        """Every batch's fingerprints in the workspace, but those of the samples ``without``."""
        erased, ours = cls(key), key_id(key)
        for entry in _erased_entries(Path(root) / ERASED_ROWS_PATH):
            rows = [r for r in entry.get("rows", []) if r[0] not in without]
            if entry.get("key") != ours:
                erased.other_key += len(rows)
                continue
            for sample_id, length, digest in rows:
                erased.owners[bytes.fromhex(digest)] = sample_id
                erased.lengths.add(int(length))
        return erased

    def digest(self) -> bytes:
        return hashlib.blake2b(b"".join(sorted(self.owners)), digest_size=16).digest()

    def samples_in(self, path: Path, data: bytes) -> set[str]:
        """The samples whose row is a row of an array file (``.npy``/``.npz``): each row hashed once."""
        if not self.owners or not path.name.endswith(ARRAY_SUFFIXES):
            return set()
        try:
            loaded = np.load(io.BytesIO(data), allow_pickle=False)
            arrays = [loaded[name] for name in loaded.files] if hasattr(loaded, "files") else [loaded]
        except (ValueError, OSError, EOFError):  # not an array file after all
            return set()
        found: set[str] = set()
        for array in arrays:
            for rows in _as_float32_rows(array, self.lengths):
                for row in rows:
                    owner = self.owners.get(keyed_digest(self.key, row.tobytes()))
                    if owner is not None:
                        found.add(owner)
        return found


def _as_float32_rows(array: np.ndarray, lengths: set[int]) -> list[np.ndarray]:
    """The array's rows as little-endian float32 — as the project stores them — if their length is one
    a fingerprint has: a float64 copy narrowed back, an 8-bit image both as values and over 255."""
    if array.dtype.kind not in "fiu" or array.size == 0:
        return []
    rows = array.reshape(len(array), -1) if array.ndim > 1 else array.reshape(1, -1)
    if rows.shape[1] not in lengths:
        return []
    forms = [rows.astype("<f4")]
    if array.dtype.kind in "iu":
        forms.append((rows.astype(np.float64) / 255.0).astype("<f4"))
    return forms


def _erased_entries(path: Path) -> Iterator[dict]:
    for line in path.read_bytes().splitlines() if path.is_file() else []:
        try:
            yield json.loads(line)
        except ValueError:  # a torn last append: its batch appends it again when it resumes
            continue


def remember_erased(root: Path, batch_id: str, fingerprints: Fingerprints) -> None:
    """Append the batch's keyed fingerprints (``ErasedRows``), once per batch, fsynced."""
    path = Path(root) / ERASED_ROWS_PATH
    if any(entry.get("batch_id") == batch_id for entry in _erased_entries(path)):
        return
    key = fingerprint_key(root)
    rows = sorted([sample_id, len(row) // 4, keyed_digest(key, row).hex()]
                  for sample_id, stored in fingerprints.stored.items() for row in stored)
    line = json.dumps({"batch_id": batch_id, "key": key_id(key), "rows": rows}, separators=(",", ":")).encode()
    _append_line(path, line)


def _append_line(path: Path, line: bytes) -> None:
    """One JSON line appended and fsynced; after a torn append, on a line of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as out:
        size = out.seek(0, os.SEEK_END)
        torn = size > 0 and out.seek(size - 1) >= 0 and out.read(1) != b"\n"
        out.write((b"\n" if torn else b"") + line + b"\n")  # after a torn append, a line of its own
        out.flush()
        os.fsync(out.fileno())


@dataclass
class Store:
    """A place the product writes to: a name, its directories, and whether the scan covers it. A
    store that is no files (a database) has ``contents`` instead: called at scan time, it yields its
    parts as (name, bytes) — e.g. a table's rows as text — and ``location`` says where it is."""

    name: str
    paths: list[Path]
    in_scope: bool = True
    note: str = ""
    contents: Callable[[], Iterator[tuple[str, bytes]]] | None = None
    location: str = ""


class StoreScan(BaseModel):
    name: str
    paths: list[str]
    in_scope: bool
    note: str = ""
    files: int = 0
    bytes: int = 0
    found: list[str] = []  # files holding a deleted row

    @property
    def clean(self) -> bool:
        return not self.found


class SourceErasure(BaseModel):
    """The user's source file (inside the workspace) and the deleted rows: ``rewritten`` without them
    by the batch, or ``pending``: still there — the user's system of record, or a source the batch
    cannot rewrite — until ``fedunlearn rescan`` finds them gone (``cleared_at``)."""

    dataset: str
    path: str  # as params.yaml declares it
    system_of_record: bool = False
    action: str  # "rewritten" | "pending" | "clean" (nothing of the batch was in it)
    removed: int = 0
    pending_ids: list[str] = []
    pending_places: list[str] = []  # file lines, table rows or image files
    reason: str = ""  # why pending
    rescan: str = ""  # the command that checks again
    cleared_at: str | None = None  # when a rescan found the rows gone (ISO 8601 UTC)

    @property
    def pending(self) -> bool:
        return bool(self.pending_ids) and self.cleared_at is None

    def line(self) -> str:
        """What became of the source file, in one line (the rows to delete, while pending)."""
        if self.pending:
            places = ", ".join(self.pending_places[:10]) + (" …" if len(self.pending_places) > 10 else "")
            ids = ", ".join(self.pending_ids[:10]) + (f" and {len(self.pending_ids) - 10} more"
                                                      if len(self.pending_ids) > 10 else "")
            return (f"erasure PENDING at the source {self.path}: {self.reason}, so the pipeline left it as it is; "
                    f"delete the rows of {len(self.pending_ids)} deleted sample(s) there (IDs {ids}"
                    + (f"; {places}" if places else "") + f"), then run `{self.rescan}`")
        if self.cleared_at:
            return f"source {self.path}: the deleted rows were found gone by a rescan at {self.cleared_at}"
        if self.action == "rewritten":
            return f"source {self.path} rewritten without its {self.removed} deleted row(s)"
        return f"source {self.path}: holds none of the deleted rows"


class ErasureReport(BaseModel):
    verified: bool  # at least one sample checked and no checked sample's bytes found in a store in scope
    deleted_samples: int
    checked_samples: int
    not_verifiable: dict[str, str]
    found: dict[str, list[str]]  # sample ID -> files that still hold its bytes
    scanned: list[str]
    files_scanned: int
    bytes_scanned: int
    scope: str
    stores: list[StoreScan] = []
    # Rows deleted by earlier batches, looked for by keyed fingerprint in every array file of the stores in
    # scope (``ErasedRows``); those under a key this workspace does not hold cannot be checked.
    earlier_rows_checked: int = 0
    earlier_rows_not_checkable: int = 0
    # Retired versions' weights (``WindowMatcher``), looked for in every file: version -> files holding them.
    retired_versions_checked: int = 0
    retired_versions_not_checkable: int = 0
    weights_found: dict[str, list[str]] = {}
    # The dataset's own source file, inside the workspace (``fedunlearn.data.source_erasure``).
    source: SourceErasure | None = None

    @property
    def source_pending(self) -> bool:
        """The deleted rows are still in the user's source file, to be removed there."""
        return self.source is not None and self.source.pending

    @property
    def weights_clean(self) -> bool:
        """No store in scope holds a retired version's weights (vacuously, when none is retired)."""
        return not self.weights_found

    def holding_stores(self) -> list[StoreScan]:
        return [store for store in self.stores if store.found]


class RowMatcher:
    """Finds which of many byte rows occur anywhere in a buffer, in one pass whatever their number.

    Searching the buffer once per row costs a pass per deleted sample: minutes for a class of
    MNIST. Instead each row is indexed by an 8-byte anchor (its window with the most non-zero
    bytes, the least likely to recur by chance); the buffer is read as 8-byte words at each of
    the 8 byte offsets, words that hash into the anchor table are candidates, and a candidate
    counts only if the whole row matches there. Exact, and unaligned matches are found too.
    """

    ANCHOR_BYTES = 8
    TABLE_BITS = 22
    CHUNK_WORDS = 1 << 21  # bounds the temporaries for large files

    def __init__(self, rows: set[bytes]):
        self.by_anchor: dict[int, list[tuple[int, Any]]] = {}
        for row in rows:
            offset = anchor_offset(row)
            self._add(int.from_bytes(row[offset:offset + self.ANCHOR_BYTES], "little"), offset, row)
        self._build_table()

    def _add(self, anchor: int, offset: int, entry: Any) -> None:
        self.by_anchor.setdefault(anchor, []).append((offset, entry))

    def _build_table(self) -> None:
        self.table = np.zeros(1 << self.TABLE_BITS, dtype=bool)
        self.table[self._slots(np.fromiter(self.by_anchor, dtype=np.uint64, count=len(self.by_anchor)))] = True

    def _confirms(self, data: bytes, begin: int, entry: Any) -> bool:
        """Whether the whole of ``entry`` is at ``begin``, once its anchor matched."""
        return data[begin:begin + len(entry)] == entry

    @classmethod
    def _slots(cls, words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        # Multiplicative (Fibonacci) hashing: the top bits of word × 2^64/φ, wrapping on overflow. In
        # place in ``out`` (a scan's one buffer): no temporaries, a quarter of the time.
        out = np.multiply(words, np.uint64(0x9E3779B97F4A7C15), out=out)
        return np.right_shift(out, np.uint64(64 - cls.TABLE_BITS), out=out).view(np.int64)

    def rows_in(self, data: bytes) -> set:
        found: set = set()
        slots = np.empty(min(len(data) // self.ANCHOR_BYTES, self.CHUNK_WORDS), dtype=np.uint64)
        for shift in range(self.ANCHOR_BYTES):
            count = (len(data) - shift) // self.ANCHOR_BYTES
            if count <= 0:
                continue
            words = np.frombuffer(data, dtype="<u8", count=count, offset=shift)
            for start in range(0, count, self.CHUNK_WORDS):
                chunk = words[start:start + self.CHUNK_WORDS]
                for index in np.flatnonzero(self.table[self._slots(chunk, slots[:len(chunk)])]):
                    position = shift + self.ANCHOR_BYTES * (start + int(index))
                    for offset, row in self.by_anchor.get(int(chunk[index]), ()):
                        begin = position - offset
                        if begin >= 0 and self._confirms(data, begin, row):
                            found.add(row)
        return found


def anchor_offset(row: bytes, width: int = 8) -> int:
    """The start of ``row``'s window of ``width`` bytes with the most non-zero bytes: the one least
    likely to recur by chance, which a scan looks up first."""
    window = np.lib.stride_tricks.sliding_window_view(np.frombuffer(row, np.uint8), width)
    return int(np.argmax(np.count_nonzero(window, axis=1)))


# Retired versions' weights: per tensor, its first WINDOW_BYTES as stored (float32), kept as an
# 8-byte anchor and HMAC-SHA256 under the fingerprint key — a later scan recognises any copy of the tensor
# (a torch file, a pickle, an array) without the workspace keeping the weights it deleted.
RETIRED_WEIGHTS_PATH = Path("data/ledger/retired-weights.jsonl")
WINDOW_BYTES = 256


@dataclass(frozen=True)
class WeightWindow:
    owner: str  # "<model> v<version>"
    offset: int  # of the anchor inside the window
    anchor: int
    length: int
    digest: bytes


def weight_windows(key: bytes, owner: str, tensors: list[bytes]) -> list[WeightWindow]:
    """The keyed windows of a version's tensors (each tensor's raw bytes); tensors too small or too
    empty to recognise are left out."""
    windows = []
    for raw in tensors:
        window = raw[:WINDOW_BYTES]
        if len(window) < RowMatcher.ANCHOR_BYTES * 4 or not _distinctive(window):
            continue
        offset = anchor_offset(window)
        windows.append(WeightWindow(owner, offset, int.from_bytes(window[offset:offset + 8], "little"), len(window),
                                    keyed_digest(key, window)))
    return windows


class WindowMatcher(RowMatcher):
    """``RowMatcher`` for keyed windows: an anchor's candidate counts when the HMAC of the bytes around
    it is the window's."""

    def __init__(self, key: bytes, windows: list[WeightWindow]):
        self.key, self.by_anchor = key, {}
        self.versions = {window.owner for window in windows}
        for window in windows:
            self._add(window.anchor, window.offset, window)
        self._build_table()

    def _confirms(self, data: bytes, begin: int, entry: Any) -> bool:
        piece = data[begin:begin + entry.length]
        return len(piece) == entry.length and hmac.compare_digest(keyed_digest(self.key, piece), entry.digest)

    def owners_in(self, data: bytes) -> set[str]:
        return {window.owner for window in self.rows_in(data)} if self.by_anchor else set()


def remember_retired(root: Path, owner: str, windows: list[WeightWindow]) -> None:
    """Append a retiring version's keyed windows once (a resumed retirement finds them there), fsynced."""
    path = Path(root) / RETIRED_WEIGHTS_PATH
    if any(entry.get("version") == owner for entry in _erased_entries(path)):
        return
    line = json.dumps({"version": owner, "key": key_id(fingerprint_key(root)),
                       "windows": [[w.offset, w.anchor, w.length, w.digest.hex()] for w in windows]},
                      separators=(",", ":")).encode()
    _append_line(path, line)


def retired_windows(root: Path, key: bytes) -> tuple[list[WeightWindow], int]:
    """Every retired version's windows under ``key``, and how many versions' were made under another."""
    windows, other, ours = [], 0, key_id(key)
    for entry in _erased_entries(Path(root) / RETIRED_WEIGHTS_PATH):
        if entry.get("key") != ours:
            other += 1
            continue
        windows += [WeightWindow(entry["version"], int(o), int(a), int(n), bytes.fromhex(d))
                    for o, a, n, d in entry.get("windows", [])]
    return windows, other


def files_under(roots: list[Path]) -> Iterator[Path]:
    for root in roots:
        if root.is_file() and not root.is_symlink():
            yield root
            continue
        for directory, _, names in os.walk(root):  # never follows directory symlinks
            for name in sorted(names):
                path = Path(directory) / name
                # Regular files only: a symlink is not followed, and a FIFO or a device (one a user dropped
                # into the inbox ends up in quarantine/) stores no bytes; reading a FIFO would block forever.
                if stat.S_ISREG(path.lstat().st_mode):
                    yield path


# Files whose numbers are read as text too: serialised examples, configs, logs, CSV, sqlite
# databases (JSON in a TEXT column is stored as text). Other binaries (.npy, .pt, .pt2 weights) are
# searched as bytes only.
TEXT_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".txt", ".md", ".csv", ".tsv", ".log", ".db", ".sqlite",
                 ".html", ".MLmodel", "MLmodel", ".py")
NUMBER = re.compile(rb"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _looks_textual(path: Path, data: bytes) -> bool:
    return path.name.endswith(TEXT_SUFFIXES) or b"\0" not in data[:8192]


def text_numbers(data: bytes, dtype: str) -> bytes:
    """The numbers a text writes, in order, as the bytes of an array of ``dtype``."""
    values = np.array([float(match) for match in NUMBER.findall(data)], dtype=np.float64)
    with np.errstate(over="ignore"):  # a number beyond the dtype's range becomes inf: it matches no row
        return values.astype(np.dtype(dtype)).tobytes() if len(values) else b""


def _relative(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return path.as_posix()


# A file changed within this many seconds of being read is not remembered as clean: a write in the same
# timestamp tick as the read would leave its size and times as they were.
SETTLED_SECONDS = 1.0


def _identity(found: os.stat_result) -> tuple[int, int, int, int]:
    return found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


@dataclass
class _Search:
    """What one scan looks for: this batch's rows (bytes, and numbers in text) and earlier batches'
    keyed fingerprints; what it found, sample ID -> files."""

    fingerprints: Fingerprints
    erased: ErasedRows | None
    weights: WindowMatcher | None = None
    owners: dict[bytes, list[str]] = field(default_factory=dict)
    found: dict[str, set[str]] = field(default_factory=dict)
    weights_found: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for sample_id, rows in self.fingerprints.by_sample.items():
            for row in rows:
                self.owners.setdefault(row, []).append(sample_id)
        self.matcher = RowMatcher(set(self.owners))
        # Numbers in text are read back as float32 as well: a float64 copy printed as text rounds to the row.
        self.float_dtypes = sorted({d for d in self.fingerprints.dtypes if np.dtype(d).kind == "f"} | {"<f4"})

    def samples_in(self, path: Path, data: bytes) -> set[str]:
        hits = self.matcher.rows_in(data)
        if self.owners and _looks_textual(path, data):
            for dtype in self.float_dtypes:
                hits |= self.matcher.rows_in(text_numbers(data, dtype))
        samples = {sample_id for row in hits for sample_id in self.owners[row]}
        if self.erased is not None:
            samples |= self.erased.samples_in(path, data)
        return samples

    def holds(self, path: Path, data: bytes, label: str) -> bool:
        """Whether ``data`` holds a deleted row or a retired version's weights; what it holds is recorded
        under ``label``."""
        samples = self.samples_in(path, data)
        versions = self.weights.owners_in(data) if self.weights is not None else set()
        for sample_id in samples:
            self.found.setdefault(sample_id, set()).add(label)
        for version in versions:
            self.weights_found.setdefault(version, set()).add(label)
        return bool(samples or versions)


def verify_erasure(fingerprints: Fingerprints, stores: list[Store], base: Path,
                   clean: set[tuple] | None = None, erased: ErasedRows | None = None,
                   weights: WindowMatcher | None = None) -> ErasureReport:
    """Read every file of every store in scope once and search it for every fingerprint, and — with
    ``erased`` — every row of its arrays for the keyed fingerprints of earlier batches' rows. ``clean``:
    files an earlier scan for the same fingerprints read and found clean, by path and identity (inode,
    size, modification and change times): those still identical are not read again; files found clean
    here are added (a deletion batch scans its stores twice, the second time mostly unchanged files).
    ``weights``: retired versions' keyed windows, looked for in every file too."""
    search = _Search(fingerprints, erased, weights)
    scans = []
    for store in stores:
        scan = StoreScan(name=store.name, paths=[store.location] if store.location else
                         [_relative(p, base) for p in store.paths], in_scope=store.in_scope, note=store.note)
        scans.append(scan)
        if store.in_scope and store.contents is not None:
            _scan_contents(store, scan, search)
        if not store.in_scope or store.contents is not None:
            continue
        holding: set[str] = set()
        for path in files_under([p for p in store.paths if p.exists()]):
            before = path.stat()
            if clean is not None and (str(path), *_identity(before)) in clean:
                scan.files, scan.bytes = scan.files + 1, scan.bytes + before.st_size
                continue
            data = path.read_bytes()
            scan.files, scan.bytes = scan.files + 1, scan.bytes + len(data)
            held = search.holds(path, data, _relative(path, base))
            after = path.stat()
            if (clean is not None and not held and _identity(after) == _identity(before)
                    and time.time() - after.st_ctime_ns / 1e9 > SETTLED_SECONDS):
                clean.add((str(path), *_identity(after)))
            if held:
                holding.add(_relative(path, base))
        scan.found = sorted(holding)
    return _report(fingerprints, erased, search, scans)


def _scan_contents(store: Store, scan: StoreScan, search: _Search) -> None:
    """A store read as named parts (a database's tables): each part searched like a text file."""
    holding: set[str] = set()
    parts: set[str] = set()
    for name, data in store.contents():
        part = name.split("#", 1)[0]  # a large table comes in chunks of whole rows: one part
        parts.add(part)
        scan.bytes += len(data)
        label = f"{store.name}:{part}"  # e.g. prefect-database:prefect/public.log
        if search.holds(Path(f"{part}.txt"), data, label):
            holding.add(label)
    scan.files = len(parts)
    scan.found = sorted(holding)


def _report(fingerprints: Fingerprints, erased: ErasedRows | None, search: _Search,
            scans: list[StoreScan]) -> ErasureReport:
    in_scope = [scan for scan in scans if scan.in_scope]
    found = search.found
    return ErasureReport(verified=bool(fingerprints.by_sample) and not found and not search.weights_found,
                         deleted_samples=len(fingerprints.sample_ids()),
                         checked_samples=len(fingerprints.by_sample),
                         not_verifiable=fingerprints.not_verifiable,
                         found={k: sorted(v) for k, v in sorted(found.items())},
                         scanned=[path for scan in in_scope for path in scan.paths],
                         files_scanned=sum(scan.files for scan in in_scope),
                         bytes_scanned=sum(scan.bytes for scan in in_scope),
                         scope="; ".join(f"{scan.name}: {'scanned' if scan.in_scope else 'not scanned'}"
                                         f"{' — ' + scan.note if scan.note else ''}" for scan in scans),
                         stores=scans,
                         earlier_rows_checked=len(erased.owners) if erased else 0,
                         earlier_rows_not_checkable=erased.other_key if erased else 0,
                         retired_versions_checked=len(search.weights.versions) if search.weights else 0,
                         weights_found={k: sorted(v) for k, v in sorted(search.weights_found.items())})
