"""Erasure of raw data: after a batch the deleted rows' bytes are gone from the workspace; the
DVC cache still holds them (the check can fail, and does) until the purge removes earlier
versions — after which no file under data/ or .dvc/cache holds them."""

import os
from pathlib import Path

import numpy as np

from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.batch import PendingRequest
from fedunlearn.requests.erasure import RowMatcher
from fedunlearn.requests.erasure import verify_erasure as scan
from fedunlearn.requests.inbox import InboxItem
from fedunlearn.requests.model import DeletionRequestModel
from tasks.requests import (append_ledger, capture_fingerprints, open_batch, purge_cache, reproduce_versions,
                            validate_requests, verify_erasure)
from tasks.workspace import reproduce


def files_holding(roots: list[Path], rows: set[bytes]) -> set[str]:
    """Independent of the code under test: every file under ``roots`` holding any of ``rows``."""
    return {str(p) for root in roots for p in root.rglob("*")
            if p.is_file() and not p.is_symlink() and any(row in p.read_bytes() for row in rows)}


def test_the_row_matcher_finds_exactly_the_rows_present_at_any_offset():
    rng = np.random.default_rng(0)
    # Image-like rows: mostly zeros, a few pixel values, as float32 bytes.
    images = (rng.random((40, 64)) < 0.3) * rng.integers(1, 17, (40, 64)) / 16.0
    rows = [r.astype(np.float32).tobytes() for r in images]
    haystack = bytearray(rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes())
    for k, row in enumerate(rows[:20]):  # non-overlapping, deliberately unaligned
        start = 9_000 * k + 1 + k % 7
        haystack[start:start + len(row)] = row
    data = bytes(haystack)
    assert RowMatcher(set(rows)).rows_in(data) == {row for row in rows if row in data} == set(rows[:20])


def test_purge_removes_the_deleted_rows_from_the_cache_and_verification_proves_it(workspace):
    before = reproduce(workspace, "digits-hfl")
    client = load_horizontal("digits-hfl", workspace).clients[1]
    forget = client.sample_ids[:10].tolist()
    request = DeletionRequestModel(kind="sample", scenario="digits-hfl", sample_ids=forget)
    plan = validate_requests.fn(workspace, "digits-hfl",
                                [PendingRequest(request, [InboxItem("r.json", Path("r.json"), request=request)])])
    record = open_batch.fn(workspace, plan, [], True)
    fingerprints = capture_fingerprints.fn(workspace, record)
    assert set(fingerprints.by_sample) | set(fingerprints.not_verifiable) == set(forget)
    assert len(fingerprints.by_sample) >= 8  # digits rows (64 float32) are distinctive; duplicates are skipped
    assert client.features[0].tobytes() in fingerprints.by_sample[forget[0]]
    rows = {row for found in fingerprints.by_sample.values() for row in found}

    record = reproduce_versions.fn(workspace, append_ledger.fn(workspace, record))
    assert record.data_version_before == before != record.data_version_after
    cache = workspace / ".dvc" / "cache"
    # Without the purge the cache still holds the earlier version: the check finds the rows.
    unpurged = scan(fingerprints, [workspace / "data", cache], workspace, "test")
    assert not unpurged.verified and set(unpurged.found) == set(fingerprints.by_sample)
    assert all(f.startswith(".dvc/cache/") for found in unpurged.found.values() for f in found)
    assert files_holding([cache], rows) and not files_holding([workspace / "data"], rows)

    record = verify_erasure.fn(workspace, purge_cache.fn(workspace, record), fingerprints)
    report = record.erasure
    assert record.purged and report.verified and report.found == {}
    assert report.scanned == ["data", ".dvc/cache"] and report.checked_samples == len(fingerprints.by_sample)
    assert report.files_scanned == sum(len(files) for root in ("data", ".dvc/cache")
                                       for _, _, files in os.walk(workspace / root))
    assert "installed packages" in report.scope
    assert not files_holding([workspace / "data", cache], rows)
