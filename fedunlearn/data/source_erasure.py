"""The user's source file is part of the erasure.

A deletion batch removes a sample from the prepared data and every partition; the CSV, Parquet
table or image folder the user declared still holds it, and where that file is inside the
workspace the erasure scan finds its bytes there. So the batch either rewrites the source without
the deleted rows — atomically: the new file is written next to it, fsynced and renamed over it
(the directory fsynced too), so a reader sees the old file or the new one, and the old file's
bytes are no longer reachable from the workspace — or, where the user declared the file their
system of record (``system_of_record: true``), leaves it alone and names the rows to delete there:
the erasure stays *pending* until ``fedunlearn rescan`` finds them gone.

Only a source whose rows are named by the user's own IDs can be rewritten: a table with an
``id_column`` (positional IDs would shift under every later row) or an image folder (a file per
sample). Any other source inside the workspace is reported pending, with the reason.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fedunlearn.dataset_specs import CsvSpec, ImageFolderSpec, ParquetSpec, inside
from fedunlearn.errors import InputError

SHOWN = 10  # IDs and lines a message lists; all are counted


@dataclass
class SourceRows:
    """The deleted samples still in a source: their IDs and where they are (file lines of a CSV —
    the header is line 1 —, row numbers of a table, or the image files)."""

    ids: list[str] = field(default_factory=list)
    places: list[str] = field(default_factory=list)


def in_workspace(spec, root: Path) -> bool:
    return spec is not None and inside(spec.path, root)


def not_rewritable(spec) -> str | None:
    """Why the batch cannot rewrite this source without the deleted rows (None: it can)."""
    if isinstance(spec, ImageFolderSpec):
        return None
    if isinstance(spec, CsvSpec):
        return None if spec.id_column else ("its rows have no ID column (IDs are row positions, which deleting a row "
                                            "would shift): declare id_column")
    return f"a {spec.source} source is not rewritten by the pipeline"


def _csv_records(text: str) -> list[tuple[int, list[str], str]]:
    """Each record of a CSV: its first file line, its fields and its exact text (quoted newlines kept)."""
    lines = text.splitlines(keepends=True)
    reader = csv.reader(iter(lines))
    records, start = [], 0
    for fields in reader:
        end = reader.line_num
        records.append((start + 1, fields, "".join(lines[start:end])))
        start = end
    return records


def _csv_id_index(records: list[tuple[int, list[str], str]], spec: CsvSpec) -> int:
    header = records[0][1] if records else []
    if spec.id_column not in header:
        raise InputError(f"{spec.path}: no ID column {spec.id_column!r}; columns are {header}")
    return header.index(spec.id_column)


def rows_in_source(spec, dataset: str, ids: set[str]) -> SourceRows:
    """Which of ``ids`` the source still holds, and where."""
    from fedunlearn.data.datasets import load_source

    found = SourceRows()
    if isinstance(spec, CsvSpec) and not isinstance(spec, ParquetSpec) and spec.id_column:
        records = _csv_records(Path(spec.path).read_bytes().decode("utf-8"))
        column = _csv_id_index(records, spec)
        for line, fields, _ in records[1:]:
            if len(fields) > column and fields[column] in ids:
                found.ids.append(fields[column])
                found.places.append(f"line {line}")
        return found
    if isinstance(spec, ImageFolderSpec):
        root = Path(spec.path)
        for sample_id in sorted(ids):
            if (root / sample_id).is_file():
                found.ids.append(sample_id)
                found.places.append(sample_id)
        return found
    present = load_source(dataset, spec).sample_ids.tolist()
    for index, sample_id in enumerate(present):
        if sample_id in ids:
            found.ids.append(sample_id)
            found.places.append(f"row {index + 1}")
    return found


def remove_from_source(spec, ids: set[str]) -> int:
    """Rewrite the source without the samples ``ids`` (atomically); returns how many rows went. A
    second call finds nothing to remove (a resumed batch)."""
    if isinstance(spec, ImageFolderSpec):
        removed = 0
        for sample_id in sorted(ids):
            path = Path(spec.path) / sample_id
            if path.is_file() and inside(path, spec.path):
                path.unlink()
                _fsync_directory(path.parent)
                removed += 1
        return removed
    if isinstance(spec, ParquetSpec):
        import pandas as pd

        frame = pd.read_parquet(spec.path)
        keep = ~frame[spec.id_column].astype(str).isin(ids)
        if keep.all():
            return 0
        buffer = io.BytesIO()
        frame[keep].to_parquet(buffer, index=False)
        _replace(Path(spec.path), buffer.getvalue())
        return int((~keep).sum())
    path = Path(spec.path)
    records = _csv_records(path.read_bytes().decode("utf-8"))
    column = _csv_id_index(records, spec)
    kept = [records[0]] + [r for r in records[1:] if not (len(r[1]) > column and r[1][column] in ids)]
    if len(kept) == len(records):
        return 0
    _replace(path, "".join(text for _, _, text in kept).encode())
    return len(records) - len(kept)


def _replace(path: Path, data: bytes) -> None:
    """``path``'s contents replaced by ``data``: a temporary file beside it, fsynced, renamed over it."""
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, path.stat().st_mode & 0o7777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def listed(items: list[str]) -> str:
    return ", ".join(items[:SHOWN]) + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")
