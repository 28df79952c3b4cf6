"""Erasure of raw data: after a batch the deleted rows' bytes are gone from the workspace; the
DVC cache still holds them (the check can fail, and does) until the purge removes earlier
versions — after which no file of any store holds them. Rows written as numbers in a text file
(an MLflow input example) are found too, and a purge rewrites the examples of versions registered
before they were zeros."""

import json
import os
from pathlib import Path

import numpy as np

from fedunlearn.data.store import load_horizontal
from fedunlearn.requests.batch import PendingRequest
from fedunlearn.requests.erasure import RowMatcher, Store, text_numbers
from fedunlearn.requests.erasure import verify_erasure as scan
from fedunlearn.requests.inbox import InboxItem
from fedunlearn.requests.model import DeletionRequestModel
from tasks.erasure import capture_fingerprints, purge_cache, verify_erasure
from tasks.requests import append_ledger, open_batch, reproduce_versions
from tasks.validation import validate_requests
from stores.workspace import Workspace, reproduce


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
    ws = Workspace.open(workspace)
    client = load_horizontal("digits-hfl", workspace).clients[1]
    forget = client.sample_ids[:10].tolist()
    request = DeletionRequestModel(kind="sample", scenario="digits-hfl", sample_ids=forget)
    plan = validate_requests.fn(ws, "digits-hfl",
                                [PendingRequest(request, [InboxItem("r.json", Path("r.json"), request=request)])])
    record = open_batch.fn(ws, plan, [], True)
    fingerprints = capture_fingerprints.fn(ws, record)
    assert set(fingerprints.by_sample) | set(fingerprints.not_verifiable) == set(forget)
    assert len(fingerprints.by_sample) >= 8  # digits rows (64 float32) are distinctive; duplicates are skipped
    assert client.features[0].tobytes() in fingerprints.by_sample[forget[0]]
    rows = {row for found in fingerprints.by_sample.values() for row in found}

    record = reproduce_versions.fn(ws, append_ledger.fn(ws, record))
    assert record.data_version_before == before != record.data_version_after
    cache = workspace / ".dvc" / "cache"
    # Without the purge the cache still holds the earlier version: the check finds the rows.
    unpurged = scan(fingerprints, [Store("data", [workspace / "data"]), Store("dvc-cache", [cache])], workspace)
    assert not unpurged.verified and set(unpurged.found) == set(fingerprints.by_sample)
    assert [store.name for store in unpurged.holding_stores()] == ["dvc-cache"]
    assert all(f.startswith(".dvc/cache/") for found in unpurged.found.values() for f in found)
    assert files_holding([cache], rows) and not files_holding([workspace / "data"], rows)

    record = verify_erasure.fn(ws, purge_cache.fn(ws, record, fingerprints), fingerprints)
    report = record.erasure
    assert record.purged and report.verified and report.found == {}
    assert [s.name for s in report.stores] == ["data", "receipts", "dvc-cache", "mlflow", "prefect", "temporary files",
                                              "model caches", "benchmark outputs"]
    assert all(s.in_scope for s in report.stores) and report.checked_samples == len(fingerprints.by_sample)
    scanned = [workspace / "data", cache, workspace / "mlflow", workspace / ".tmp"]
    assert report.files_scanned >= sum(len(files) for root in scanned for _, _, files in os.walk(root))
    assert "installed packages" in report.scope
    assert not files_holding([workspace / "data", cache], rows)


def test_rows_written_as_numbers_in_text_are_found():
    rng = np.random.default_rng(1)
    row = (rng.integers(0, 17, 64) / 16.0).astype(np.float32)
    as_json = ('{"inputs": [[' + ", ".join(str(float(v)) for v in row) + ']]}').encode()
    assert row.tobytes() not in as_json  # not as bytes ...
    assert RowMatcher({row.tobytes()}).rows_in(text_numbers(as_json, "<f4")) == {row.tobytes()}  # ... but as numbers
    assert not RowMatcher({row.tobytes()}).rows_in(text_numbers(as_json.replace(b"0.", b"1."), "<f4"))


def test_purge_rewrites_a_registered_version_whose_input_example_holds_deleted_rows(workspace):
    """A version registered before input examples were zeros: its examples hold the first test rows."""
    import mlflow.pytorch
    import torch
    from mlflow import MlflowClient

    from models import build_model
    from stores.registry import tracking_uri

    reproduce(workspace, "digits-hfl")
    ws = Workspace.open(workspace)
    test = load_horizontal("digits-hfl", workspace).test
    model = build_model("cnn", (1, 8, 8), 10)
    run_id = ws.registry.start_run("digits-hfl", "legacy", {}, {})
    # MLflow's global URIs, as versions were once logged; the registry's too, or a process whose earlier
    # test pinned it would register this version elsewhere.
    mlflow.set_tracking_uri(tracking_uri(workspace))
    mlflow.set_registry_uri(tracking_uri(workspace))
    with mlflow.start_run(run_id=run_id):
        torch.save(model.state_dict(), workspace / ".tmp" / "weights.pt")
        mlflow.log_artifact(str(workspace / ".tmp" / "weights.pt"), artifact_path="weights")
        (workspace / ".tmp" / "weights.pt").unlink()
        info = mlflow.pytorch.log_model(model, name="model", input_example=test.features[:2],
                                        pip_requirements=mlflow.pytorch.get_default_pip_requirements())
    mlflow.register_model(info.model_uri, "digits-hfl", tags={"scenario": "digits-hfl", "role": "original"})
    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)
    rows = {test.features[k].tobytes() for k in range(2)}
    assert files_holding([workspace / "mlflow"], rows)  # the pt2 archive keeps the example as raw float32

    forget = test.sample_ids[:2].tolist()
    request = DeletionRequestModel(kind="sample", scenario="digits-hfl", sample_ids=forget)
    plan = validate_requests.fn(ws, "digits-hfl",
                                [PendingRequest(request, [InboxItem("r.json", Path("r.json"), request=request)])])
    record = append_ledger.fn(ws, open_batch.fn(ws, plan, [], True))
    fingerprints = capture_fingerprints.fn(ws, record)
    record = reproduce_versions.fn(ws, record)
    unpurged = verify_erasure.fn(ws, record, fingerprints).erasure
    assert not unpurged.verified and "mlflow" in [s.name for s in unpurged.holding_stores()]
    assert any(f.endswith("input_example.json") for s in unpurged.holding_stores() for f in s.found)

    report = verify_erasure.fn(ws, purge_cache.fn(ws, record, fingerprints), fingerprints).erasure
    assert report.verified and not files_holding([workspace / "mlflow"], rows)
    version = MlflowClient(tracking_uri(workspace), tracking_uri(workspace)).get_model_version("digits-hfl", "1")
    assert version.tags["erasure"] == "artifacts-rewritten" and version.tags["erasure_batch"] == record.batch_id
    served = mlflow.pytorch.load_model("models:/digits-hfl/1")  # the rewritten model still loads and predicts alike
    x = torch.as_tensor(test.features[2:6])
    assert torch.equal(served(x).argmax(1), model(x).argmax(1))


def test_a_second_scan_reads_only_what_changed_and_finds_a_row_written_since(tmp_path, monkeypatch):
    """A batch scans its stores twice with the same fingerprints: the second reads only files whose
    inode, size or times changed; a file changed within a second of its first read is read again."""
    import pathlib

    from fedunlearn.requests import erasure
    from fedunlearn.requests.erasure import Fingerprints

    rng = np.random.default_rng(2)
    row = rng.random(64).astype(np.float32)
    fingerprints = Fingerprints({"s1": {row.tobytes()}}, {}, {"<f4"})
    store = tmp_path / "store"
    store.mkdir()
    for name in ("a.npy", "b.json", "c.npy"):
        (store / name).write_bytes(rng.random(256).astype(np.float32).tobytes())
    reads = []
    read_bytes = pathlib.Path.read_bytes
    monkeypatch.setattr(pathlib.Path, "read_bytes", lambda self: reads.append(self.name) or read_bytes(self))

    clean: set = set()
    assert scan(fingerprints, [Store("s", [store])], tmp_path, clean=clean).verified
    assert sorted(reads) == ["a.npy", "b.json", "c.npy"] and clean == set()  # just written: not settled yet
    monkeypatch.setattr(erasure, "SETTLED_SECONDS", 0.0)
    reads.clear()
    assert scan(fingerprints, [Store("s", [store])], tmp_path, clean=clean).verified and len(clean) == 3

    reads.clear()
    (store / "b.json").write_text("[" + ", ".join(str(float(v)) for v in row) + "]")  # the row, as text
    report = scan(fingerprints, [Store("s", [store])], tmp_path, clean=clean)
    assert reads == ["b.json"] and report.files_scanned == 3
    assert not report.verified and report.found == {"s1": ["store/b.json"]}


def test_a_batch_carries_its_fingerprints_and_what_its_scans_found_clean(workspace, monkeypatch):
    """The process keeps no batch's rows: each capture reads them (the batch value carries them from
    its ingest to its receipt's scan), and what the ingest's scan found clean travels with them, so the
    receipt's scan reads again only what changed."""
    import tasks.erasure as erasure_tasks
    from tasks.erasure import scan_stores

    reproduce(workspace, "digits-hfl")
    ws = Workspace.open(workspace)
    ids = load_horizontal("digits-hfl", workspace).clients[0].sample_ids[:2].tolist()
    record = deletion_batch(ws, ids)
    taken = []
    capture = erasure_tasks._fingerprints
    monkeypatch.setattr(erasure_tasks, "_fingerprints", lambda w, r: taken.append(r.batch_id) or capture(w, r))
    found_clean: dict = {}

    fingerprints = capture_fingerprints.fn(ws, record)
    again = capture_fingerprints.fn(ws, record)
    applied = verify_erasure.fn(ws, reproduce_versions.fn(ws, append_ledger.fn(ws, record)), fingerprints,
                                found_clean)
    [memo_after_ingest] = found_clean  # one set of rows scanned for: one entry, that the next scan reuses
    receipt_scan = scan_stores(ws, applied.purged, fingerprints, found_clean)

    assert taken == [record.batch_id, record.batch_id] and again is not fingerprints
    assert set(fingerprints.by_sample) == set(ids) and applied.erasure.verified and receipt_scan.verified
    assert list(found_clean) == [memo_after_ingest]


def image_rows(seed: int, n: int = 6) -> np.ndarray:
    """MNIST-like rows as the project stores them: 8-bit pixels over 255, float32."""
    rng = np.random.default_rng(seed)
    pixels = (rng.random((n, 64)) < 0.4) * rng.integers(1, 256, (n, 64))
    return (pixels / 255.0).astype(np.float32)


def test_a_deleted_row_is_found_in_float64_and_as_8_bit_pixels_not_only_as_stored(tmp_path):
    from fedunlearn.requests.erasure import RowSource, take_fingerprints

    rows = image_rows(3)
    ids = np.array([f"s{k}" for k in range(len(rows))])
    fingerprints = take_fingerprints([RowSource.from_arrays("raw", ids, rows)], {"s0", "s1", "s2"})
    store = tmp_path / "store"
    store.mkdir()
    np.save(store / "copy64.npy", rows[[0, 3]].astype(np.float64))  # a float64 copy of s0 (and a retained row)
    np.save(store / "pixels.npy", np.round(rows[[1]] * 255).astype(np.uint8))  # s1 as the source's pixels
    np.save(store / "retained.npy", rows[3:].astype(np.float64))
    assert rows[0].tobytes() not in (store / "copy64.npy").read_bytes()  # not as stored ...
    report = scan(fingerprints, [Store("s", [store])], tmp_path)
    assert report.found == {"s0": ["store/copy64.npy"], "s1": ["store/pixels.npy"]}  # ... but found
    assert not report.verified and report.checked_samples == 3


def deletion_batch(ws: Workspace, sample_ids: list[str]):
    request = DeletionRequestModel(kind="sample", scenario="digits-hfl", sample_ids=sample_ids)
    plan = validate_requests.fn(ws, "digits-hfl",
                                [PendingRequest(request, [InboxItem("r.json", Path("r.json"), request=request)])])
    return open_batch.fn(ws, plan, [], False)


def test_a_row_an_earlier_batch_deleted_is_found_when_it_comes_back_by_keyed_fingerprint_only(workspace):
    """Batch 1's rows are gone from memory and disk; its keyed fingerprints (no row bytes: not as bytes,
    not as numbers, not as hex) let batch 2's scan find one of its rows saved again as float64 — and the
    fingerprint file itself holds nothing the scan finds. Without the key they match nothing."""
    from fedunlearn.requests.erasure import ERASED_ROWS_PATH, FINGERPRINT_KEY_PATH, ErasedRows, fingerprint_key
    from stores import erasure as stores
    from tasks.erasure import scan_stores

    reproduce(workspace, "digits-hfl")
    ws = Workspace.open(workspace)
    client = load_horizontal("digits-hfl", workspace).clients[0]
    first = deletion_batch(ws, client.sample_ids[:3].tolist())
    fingerprints = capture_fingerprints.fn(ws, first)
    gone = client.sample_ids[0]
    rows = {r for found in fingerprints.by_sample.values() for r in found}
    verify_erasure.fn(ws, reproduce_versions.fn(ws, append_ledger.fn(ws, first)), fingerprints)

    kept = (workspace / ERASED_ROWS_PATH).read_bytes()
    assert kept.count(b"\n") == 1 and len(json.loads(kept)["rows"]) == len(fingerprints.by_sample)
    assert not any(row in kept or row.hex().encode() in kept for row in rows)
    assert not RowMatcher(rows).rows_in(text_numbers(kept, "<f4"))
    key = workspace / FINGERPRINT_KEY_PATH
    assert not any(key.is_relative_to(path) for store in stores.erasure_stores(workspace, True)
                   for path in store.paths)

    (workspace / "data" / "exports").mkdir()
    np.save(workspace / "data" / "exports" / "copy.npy", client.features[:1].astype(np.float64))  # batch 1's row
    second = deletion_batch(ws, client.sample_ids[3:5].tolist())
    fingerprints = capture_fingerprints.fn(ws, second)
    report = verify_erasure.fn(ws, reproduce_versions.fn(ws, append_ledger.fn(ws, second)), fingerprints).erasure
    assert report.found == {gone: ["data/exports/copy.npy"]} and report.earlier_rows_checked >= 1
    assert [s.name for s in report.holding_stores()] == ["data"]  # not the fingerprint file, not the key
    assert (workspace / ERASED_ROWS_PATH).read_bytes().count(b"\n") == 2  # batch 2's, appended

    key.unlink()  # a new key: the old fingerprints can no longer be checked, and say so
    erased = ErasedRows.load(workspace, fingerprint_key(workspace))
    kept_rows = sum(len(json.loads(line)["rows"]) for line in (workspace / ERASED_ROWS_PATH).read_text().splitlines())
    assert erased.owners == {} and erased.other_key == kept_rows >= 4
    assert scan_stores(ws, False, fingerprints).found == {}  # the copy is there, but nothing can tell
