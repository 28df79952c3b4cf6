"""Issue 51 item 4: every file a command reads from a user is read up to a cap, one byte past it
refused in one line naming the file and the limit — never read whole (``/dev/zero`` once grew a
command to 22 GB). Sparse files stand for large ones: their size is the cap plus one byte, at no
cost on disk. verify-receipt's and prove-consistency's files: tests/test_transparency_hardening.py."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from fedunlearn.benchmark.regression import MAX_BASELINE_BYTES, load_baseline
from fedunlearn.config import MAX_PARAMS_BYTES, load_params
from fedunlearn.errors import InputError
from fedunlearn.requests.model import MAX_REQUEST_BYTES
from fedunlearn.user_files import read_capped
from workspaces import call_cli


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


class Endless(io.RawIOBase):
    """Standard input that never ends (``yes | fedunlearn request ... --ids-file -``)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        buffer[:] = b"x," * (len(buffer) // 2) + b"x" * (len(buffer) % 2)
        return len(buffer)


def test_a_file_one_byte_past_the_cap_is_refused_and_one_at_it_is_read(tmp_path):
    assert read_capped(sparse(tmp_path / "at", 100), "a thing", 100, "advice") == bytes(100)
    with pytest.raises(InputError, match=r"over is larger than 100 bytes, the limit for a thing: advice"):
        read_capped(sparse(tmp_path / "over", 101), "a thing", 100, "advice")
    with pytest.raises(InputError, match="larger than 1 MiB"):
        read_capped("/dev/zero", "a thing", 1 << 20, "advice")
    with pytest.raises(FileNotFoundError, match="cannot read a thing"):
        read_capped(tmp_path / "missing", "a thing", 100, "advice")


def test_request_ids_file_and_standard_input_are_capped(workspace, tmp_path, monkeypatch):
    big = sparse(tmp_path / "ids.txt", MAX_REQUEST_BYTES + 1)
    printed = call_cli(workspace, "request", "samples", "--scenario", "digits-hfl", "--ids-file", str(big))
    assert printed.status == 2 and printed.err.count("\n") == 1, printed
    assert "larger than 10 MiB" in printed.err and "split the IDs into several requests" in printed.err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    printed = call_cli(workspace, "request", "samples", "--scenario", "digits-hfl", "--ids-file", "-")
    assert printed.status == 2 and "standard input is larger than 10 MiB" in printed.err, printed
    printed = call_cli(workspace, "request", "samples", "--scenario", "digits-hfl", "--ids-file", "/dev/zero")
    assert printed.status == 2 and "--ids-file takes a regular file" in printed.err, printed
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    printed = call_cli(workspace, "request", "samples", "--scenario", "digits-hfl", "--ids-file",
                       str(tmp_path / "latin1.txt"))
    assert printed.status == 2 and "is not UTF-8 text" in printed.err and printed.err.count("\n") == 1, printed


def test_a_benchmark_baseline_and_params_yaml_are_capped(tmp_path):
    with pytest.raises(InputError, match="larger than 64 MiB"):
        load_baseline(sparse(tmp_path / "results.json", MAX_BASELINE_BYTES + 1))
    with pytest.raises(ValueError, match="not a regular file"):
        load_baseline(Path("/dev/zero"))
    with pytest.raises(InputError, match="params.yaml is larger than 4 MiB"):
        load_params(sparse(tmp_path / "params.yaml", MAX_PARAMS_BYTES + 1))
