"""Issue 47: the Merkle log names no one to whoever lacks a request's salt, never signs a history
that does not extend the heads it published, and the subject's side reads untrusted files
strictly, quickly and without torch. Without training: a ledger written directly, as in
tests/test_transparency_log.py."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, content_checksum
from fedunlearn.transparency import merkle
from fedunlearn.transparency.log import LOG_DIR, KEY_FILE, TransparencyLog, sync_workspace
from fedunlearn.transparency.proofs import build_receipt
from fedunlearn.transparency.statements import canonical_ids
from test_transparency_log import entry, logged, rewrite_ledger  # noqa: F401 (fixture)
from workspaces import call_cli

ID_SPACE = [f"toy-{n:05d}" for n in range(600)]  # a scenario's ID space: small enough to enumerate


def extra_of(receipt: str) -> dict:
    return json.loads(base64.b64decode(receipt.split("\n")[1][len("extra "):]))


def test_prefix_roots_are_the_roots_of_every_prefix():
    leaves = [merkle.leaf_hash(i.to_bytes(2, "big")) for i in range(70)]
    assert merkle.prefix_roots(leaves, range(71)) == {n: merkle.root(leaves[:n]) for n in range(71)}


def test_with_the_published_log_and_every_proof_but_no_salt_no_id_is_recovered(workspace, tmp_path):
    """The attacker of issue 47: every leaf (salts removed), every head, every receipt and witness
    proof with its salt removed, and the ID space. Each ledger line is rebuilt exactly as the
    ledger wrote it but for a guessed ID (the strongest guess: the true entry's every other field,
    its chain link included); neither it, nor any plain hash of the ID list, appears anywhere."""
    chosen = {"r1": ["toy-00017"], "r2": ["toy-00342"], "r3": ["toy-00599", "toy-00003"]}
    Ledger(workspace / LEDGER_PATH).append([entry(r, ids, "b1") for r, ids in chosen.items()])
    log = sync_workspace(workspace)
    receipts = [build_receipt(log, r) for r in chosen]
    (tmp_path / "head.checkpoint").write_text(log.head())
    witness = tmp_path / "witness.tlog-proof"
    assert call_cli(workspace, "ledger", "prove-consistency", "--since", str(tmp_path / "head.checkpoint"),
                    "--out", str(witness)).status == 0
    published = [r.leaf.decode() for r in log.records()] + [log.head(), witness.read_text()]
    for receipt in receipts:  # the receipts' salts withheld: they are the subjects' own
        extra = extra_of(receipt)
        published.append(json.dumps({k: v for k, v in extra.items() if k != "salt"}))
        published.append(receipt.split("\n", 2)[2])  # index, proof, head
    material = "\n".join(published)

    recovered = set()
    for request, entry_ in zip(chosen, Ledger(workspace / LEDGER_PATH).entries()):
        for guess in ID_SPACE:
            line = entry_.model_copy(update={"sample_ids": [guess], "subject": {"sample_ids": [guess]},
                                             "checksum": None}).document()
            digests = [content_checksum(line), hashlib.sha256(canonical_ids([guess])).hexdigest(),
                       hashlib.sha256(json.dumps([guess]).encode()).hexdigest()]
            if guess in material or any(d in material or base64.b64encode(bytes.fromhex(d)).decode() in material
                                        for d in digests):
                recovered.add(guess)
        if request == "r1":  # the guess is built as the ledger builds its line: the true ID gives its checksum
            true = entry_.model_copy(update={"checksum": None}).document()
            assert content_checksum(true) == entry_.checksum
    assert not recovered
    assert "salt" not in extra_of(witness.read_text()) and "leaf" not in extra_of(witness.read_text())


def test_a_receipt_says_it_is_as_sensitive_as_the_id_list(logged, tmp_path):
    workspace, _, _ = logged
    printed = call_cli(workspace, "receipt", "r1", "--out", str(tmp_path / "r1.tlog-proof"))
    assert printed.status == 0 and "tells the request's sample IDs to whoever holds it" in printed.out
    assert "keep it as you keep the ID list" in extra_of((tmp_path / "r1.tlog-proof").read_text())["note"]


# --- item 2: the published heads bind the log ---------------------------------------------------------

def publish(workspace: Path, store: str, tmp_path: Path) -> None:
    """The batch's publication of its head (``stores.transparency``) to MLflow, or to a DVC remote."""
    from stores.transparency import publish_tree_head
    from stores.workspace import run_dvc

    if store == "dvc":
        run_dvc(workspace, ["remote", "add", "-d", "local", str(tmp_path / "remote")])
    published = publish_tree_head(workspace)
    if store == "dvc":  # the MLflow copy gone: the remote's copy alone must bind the log
        from stores.registry.runs import Runs

        client = Runs(workspace).client
        for run in client.search_runs([e.experiment_id for e in client.search_experiments()]):
            client.delete_run(run.info.run_id)
    assert published.places, published.lines()


def lose_local_log(workspace: Path) -> None:
    for path in (workspace / LOG_DIR).glob("*"):
        if path.name == "leaves.jsonl" or path.name == "checkpoint" or path.name.startswith("head-"):
            path.unlink()


@pytest.mark.parametrize("store, rewrite", [("mlflow", "files deleted"), ("dvc", "entry dropped and re-chained")])
def test_receipt_refuses_a_lost_or_rewritten_log_that_published_heads_contradict(logged, tmp_path, store, rewrite):
    workspace, log, _ = logged
    publish(workspace, store, tmp_path)
    if rewrite == "entry dropped and re-chained":
        rewrite_ledger(workspace, lambda es: es[1:])
    lose_local_log(workspace)
    out = tmp_path / "r.tlog-proof"
    printed = call_cli(workspace, "receipt", "r2", "--out", str(out))
    assert printed.status == 4 and printed.err.count("\n") == 1 and printed.err.startswith("error: "), printed
    assert "nothing was signed" in printed.err and "`fedunlearn ledger new-log`" in printed.err
    assert not out.exists() and not log.leaves_path.exists() and not log.checkpoint_path.exists()
    assert call_cli(workspace, "ledger", "verify").status == 4

    started = call_cli(workspace, "ledger", "new-log")  # the visible way out: a new origin, published
    assert started.status == 0 and "NEW MERKLE LOG" in started.out, started
    assert call_cli(workspace, "receipt", "r2", "--out", str(out)).status == 0
    assert "/generation-2" in out.read_text()


def test_a_workspace_missing_its_key_touches_nothing(logged, tmp_path):
    workspace, log, _ = logged
    (workspace / KEY_FILE).unlink()
    before = {p.name: p.read_bytes() for p in log.directory.iterdir() if p.is_file()}
    printed = call_cli(workspace, "receipt", "r1", "--out", str(tmp_path / "r.tlog-proof"))
    assert printed.status == 4 and "signing key" in printed.err and printed.err.count("\n") == 1, printed
    assert {p.name: p.read_bytes() for p in log.directory.iterdir() if p.is_file()} == before
    assert not (workspace / KEY_FILE).exists() and not (tmp_path / "r.tlog-proof").exists()


# --- item 3: --out ----------------------------------------------------------------------------------

def test_out_never_follows_a_link_nor_overwrites_without_force(logged, tmp_path):
    workspace, log, _ = logged
    kept = tmp_path / "kept.tlog-proof"
    kept.write_text(build_receipt(log, "r1"))
    original = kept.read_text()
    printed = call_cli(workspace, "ledger", "prove-consistency", "--since", str(kept), "--out", str(kept))
    assert printed.status == 2 and "exists" in printed.err and "--force" in printed.err and kept.read_text() == original
    link = tmp_path / "link.tlog-proof"
    link.symlink_to(kept)
    for force in ([], ["--force"]):
        printed = call_cli(workspace, "receipt", "r1", "--out", str(link), *force)
        assert printed.status == 2 and "symbolic link" in printed.err and kept.read_text() == original
    printed = call_cli(workspace, "receipt", "r1", "--out", str(tmp_path))
    assert printed.status == 2 and "is a directory" in printed.err and printed.err.count("\n") == 1
    assert call_cli(workspace, "receipt", "r2", "--out", str(kept), "--force").status == 0
    assert kept.read_text() != original and "request r2" not in original


def test_out_that_cannot_be_written_says_so_in_one_line_and_leaves_nothing(logged, tmp_path, monkeypatch):
    """Issue 51: --out under a file, or on a full filesystem of its own (not the workspace's)."""
    import errno

    from cli import transparency

    workspace, _, _ = logged
    (tmp_path / "plain").write_text("")
    for command in (["receipt", "r1"], ["ledger", "prove-consistency", "--since", str(tmp_path / "head")]):
        (tmp_path / "head").write_text(TransparencyLog(workspace).head())
        printed = call_cli(workspace, *command, "--out", str(tmp_path / "plain" / "r.tlog-proof"))
        assert printed.status == 2 and "cannot be written" in printed.err and printed.err.count("\n") == 1, printed
    for out in ("/dev/full", str(tmp_path)):  # a device, a directory: never written into
        printed = call_cli(workspace, "receipt", "r1", "--out", out, "--force")
        assert printed.status == 2 and printed.err.count("\n") == 1, printed

    def full(_descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(Exception) as raised:
        transparency._write_out(tmp_path / "r.tlog-proof", "text", force=False)
    assert not (tmp_path / "r.tlog-proof").exists()
    from cli import report_error

    assert report_error(raised.value, "`fedunlearn receipt r1`", workspace) == 7
    from fedunlearn.errors import NoSpace

    assert isinstance(raised.value, NoSpace) and f"--out {tmp_path / 'r.tlog-proof'}: no space" in str(raised.value)
    assert str(workspace) not in str(raised.value)


def test_receipt_of_a_quarantined_request_says_it_was_quarantined_and_why(logged, tmp_path):
    from fedunlearn.requests.folders import RequestFolders
    from fedunlearn.requests.inbox import quarantine, scan_inbox, submit_request
    from fedunlearn.requests.model import build_request

    workspace, _, _ = logged
    folders = RequestFolders.create(workspace)
    request = build_request({"kind": "sample", "scenario": "digits-hfl", "sample_ids": ["x-1"]})
    submit_request(folders, request)
    [item] = scan_inbox(folders, "digits-hfl")
    quarantine(folders, item, "sample ID x-1 is not in the scenario's data")
    printed = call_cli(workspace, "receipt", request.request_id, "--out", str(tmp_path / "r.tlog-proof"))
    assert printed.status == 2 and printed.err.count("\n") == 1, printed
    assert f"request {request.request_id} was quarantined" in printed.err
    assert "sample ID x-1 is not in the scenario's data" in printed.err and ".reason.txt" in printed.err
    printed = call_cli(workspace, "receipt", "never-seen", "--out", str(tmp_path / "r.tlog-proof"))
    assert printed.status == 2 and "is not in the deletion ledger" in printed.err


# --- item 3: untrusted input ---------------------------------------------------------------------------

def remake(receipt: str, extra: dict | None = None, raw_extra: bytes | None = None) -> str:
    """The receipt with its extra line replaced (canonical JSON of ``extra``, or ``raw_extra``)."""
    from fedunlearn.transparency.statements import canonical

    data = raw_extra if raw_extra is not None else canonical(extra)
    lines = receipt.split("\n")
    lines[1] = "extra " + base64.b64encode(data).decode()
    return "\n".join(lines)


def malformed(receipt: str) -> dict[str, str | bytes]:
    """Over fifty receipts, each broken in its own way."""
    head, _, note = receipt.partition("\n\n")
    lines = head.split("\n")
    text, _, signature = note.rpartition("\n\n")
    extra = extra_of(receipt)
    at = lambda i, value: "\n".join(lines[:i] + [value] + lines[i + 1:]) + "\n\n" + note  # noqa: E731
    signed = lambda sig: head + "\n\n" + text + "\n\n" + sig  # noqa: E731
    swap = lambda i, value: "\n".join(text.split("\n")[:i] + [value] + text.split("\n")[i + 1:])  # noqa: E731
    checkpoint = lambda i, value: signed(signature).replace(text, swap(i, value))  # noqa: E731
    hash_, statement = base64.b64encode(b"\x00" * 32).decode(), {"index": 0, "leaf": extra["leaf"], "proof": []}
    with_extra = lambda **change: remake(receipt, {**extra, **change})  # noqa: E731
    return {
        "empty": "", "header only": lines[0] + "\n", "another header": receipt.replace(lines[0], "c2sp.org/x@v2"),
        "CRLF": receipt.replace("\n", "\r\n"), "NUL after the salt": receipt.replace(lines[1], lines[1] + "\x00"),
        "tab": receipt.replace("index ", "index\t"), "C1 control": receipt + "\x85",
        "not UTF-8": receipt.encode() + b"\xff\xfe", "too large": receipt + "\u2014 x " + "A" * (2 << 20) + "\n",
        "index 00": at(2, "index 00"), "index 01": at(2, "index 01"), "index -1": at(2, "index -1"),
        "index +0": at(2, "index +0"), "index of 5000 digits": at(2, "index " + "9" * 5000),
        "index 2**63": at(2, f"index {1 << 63}"), "index hex": at(2, "index 0x0"), "index space": at(2, "index  0"),
        "index with a trailing space": at(2, "index 0 "), "index line missing": "\n".join(lines[:2]) + "\n\n" + note,
        "extra line missing": "\n".join([lines[0]] + lines[2:]) + "\n\n" + note,
        "extra not base64": at(1, "extra !!!"), "extra padding dropped": at(1, lines[1].rstrip("=") + "x"),
        "extra a list": remake(receipt, raw_extra=b"[]"), "extra not JSON": remake(receipt, raw_extra=b"{nope"),
        "extra nested deep": remake(receipt, raw_extra=b'{"format":"fedunlearn.receipt@v1","x":' + b"[" * 50000
                                    + b"]" * 50000 + b"}"),
        "extra with whitespace": remake(receipt, raw_extra=json.dumps(extra, sort_keys=True).encode()),
        "extra duplicate keys": remake(receipt, raw_extra=b'{"format":"fedunlearn.receipt@v1","format":"x"}'),
        "extra keys unsorted": remake(receipt, raw_extra=json.dumps(dict(reversed(extra.items())),
                                                                    separators=(",", ":")).encode()),
        "format wrong": with_extra(format="fedunlearn.receipt@v0"), "statements: 5": with_extra(statements=5),
        "note without final newline": receipt.rstrip("\n"), "leaf a number": with_extra(leaf=5),
        "leaf not base64": with_extra(leaf="@@"), "leaf and its hash": with_extra(leaf_hash=hash_),
        "statement index true": with_extra(statements=[{**statement, "index": True}]),
        "statement index negative": with_extra(statements=[{**statement, "index": -1}]),
        "statement index a string": with_extra(statements=[{**statement, "index": "0"}]),
        "statement proof a dict": with_extra(statements=[{**statement, "proof": {}}]),
        "statement proof hash short": with_extra(statements=[{**statement, "proof": ["AAAA"]}]),
        "65 statements": with_extra(statements=[statement] * 65), "salt a list": with_extra(salt=[]),
        "consistency a list": with_extra(consistency=[]), "statement a string": with_extra(statements=["x"]),
        "consistency size a string": with_extra(consistency={"old_size": "1", "old_root": hash_, "proof": []}),
        "consistency root short": with_extra(consistency={"old_size": 1, "old_root": "AAAA", "proof": []}),
        "consistency of 65 hashes": with_extra(consistency={"old_size": 1, "old_root": hash_, "proof": [hash_] * 65}),
        "proof line not base64": head + "\n***\n\n" + note, "proof hash short": head + "\nAAAA\n\n" + note,
        "proof hash not canonical": head + "\n" + hash_[:-2] + "B=\n\n" + note,
        "65 proof hashes": head + ("\n" + hash_) * 65 + "\n\n" + note,
        "no note": head + "\n", "note without signature": head + "\n\n" + text + "\n\n",
        "signature with a hyphen": signed(signature.replace("\u2014", "-")),
        "signature with two spaces": signed(signature.replace(" ", "  ", 1)),
        "signature not base64": signed(signature.rsplit(" ", 1)[0] + " ***\n"),
        "signature too short": signed(signature.rsplit(" ", 1)[0] + " AAAAAA==\n"),
        "signature name with +": signed(signature.replace(" ", " a+", 1)),
        "101 signatures": signed(signature * 101), "signature of 10000 characters": signed(
            signature.rsplit(" ", 1)[0] + " " + "A" * 10000 + "\n"),
        "tree size 08": checkpoint(1, "08"), "tree size of 5000 digits": checkpoint(1, "1" * 5000),
        "root short": checkpoint(2, "AAAA"), "root line missing": head + "\n\n" + "\n".join(text.split("\n")[:2])
        + "\n\n" + signature, "empty extension line": head + "\n\n" + text + "\n\nx\n\n" + signature,
    }


def run_verify(tmp_path: Path, monkeypatch, receipt: str | bytes, key: str | bytes, *extra: str) -> tuple[int, str]:
    directory = tmp_path / "subject"
    directory.mkdir(exist_ok=True)
    monkeypatch.chdir(directory)
    monkeypatch.delenv("FEDUNLEARN_ROOT", raising=False)
    for name, content in (("receipt.tlog-proof", receipt), ("log.pub", key)):
        (directory / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    printed = call_cli(directory, "verify-receipt", "receipt.tlog-proof", "--public-key", "log.pub", *extra)
    return printed.status, printed.out + printed.err


def test_fifty_malformed_receipts_all_exit_10_with_one_line(logged, tmp_path, monkeypatch):
    workspace, _, receipt = logged
    key = (workspace / LOG_DIR / "log.pub").read_text()
    cases = malformed(receipt)
    assert len(cases) >= 50 and len(set(map(str, cases.values()))) == len(cases)
    for kind, text in cases.items():
        status, out = run_verify(tmp_path, monkeypatch, text, key)
        assert status == 10 and out.startswith("error: ") and out.count("\n") == 1, (kind, status, out[:300])
    assert run_verify(tmp_path, monkeypatch, receipt, key)[0] == 0
    status, out = run_verify(tmp_path, monkeypatch, malformed(receipt)["index 00"].replace("index 00", "index 99"), key)
    assert status == 12 and "is NOT in the log" in out  # well formed, and not in a tree of three leaves


def test_keys_ids_and_devices_are_read_strictly(logged, tmp_path, monkeypatch):
    workspace, _, receipt = logged
    key = (workspace / LOG_DIR / "log.pub").read_text()
    name, hint, encoded = key.strip().split("+", 2)
    # An upper-case hex digit in the key ID (a hint of digits alone, one key in 43, gets one put in).
    upper = hint.upper() if hint.upper() != hint else hint[:-1] + "A"
    for bad in ("", key.replace("\n", "\r\n"), key + key, f"{name}+{upper}+{encoded}\n",
                f"{name}+{hint}+{encoded[:-1]}\n", f"{name} x+{hint}+{encoded}\n", b"\xff" + key.encode()):
        status, out = run_verify(tmp_path, monkeypatch, receipt, bad)
        assert status == 10 and out.count("\n") == 1, (bad, out)
    assert run_verify(tmp_path, monkeypatch, receipt, key)[0] == 0
    for argument in (["--public-key", "/dev/zero"], ["--since", "/dev/zero"], ["--ids", "/dev/zero"]):
        printed = call_cli(tmp_path, "verify-receipt", str(tmp_path / "subject" / "receipt.tlog-proof"),
                           "--public-key", str(tmp_path / "subject" / "log.pub"), *argument)
        assert printed.status == 10 and "larger than" in printed.err, printed
    printed = call_cli(tmp_path, "verify-receipt", "/dev/zero", "--public-key", str(tmp_path / "subject" / "log.pub"))
    assert printed.status == 10 and "larger than 1 MiB" in printed.err, printed
    printed = call_cli(workspace, "ledger", "prove-consistency", "--since", "/dev/zero", "--out", str(tmp_path / "p"))
    assert printed.status == 10 and "larger than 1 MiB" in printed.err and not (tmp_path / "p").exists(), printed
    (tmp_path / "ids.txt").write_bytes(b"a\xff")
    status, out = run_verify(tmp_path, monkeypatch, receipt, key, "--ids", str(tmp_path / "ids.txt"))
    assert status == 10 and "not UTF-8" in out


# --- item 4: no torch, the key ID, --ids as `request` reads them ----------------------------------------

def test_verify_receipt_loads_no_torch_and_prints_the_key_id(logged, tmp_path, monkeypatch):
    workspace, _, receipt = logged
    key = (workspace / LOG_DIR / "log.pub").read_text()
    (tmp_path / "r.tlog-proof").write_text(receipt)
    (tmp_path / "log.pub").write_text(key)
    script = ("import sys; from cli import main; status = main(['verify-receipt', 'r.tlog-proof', '--public-key', "
              "'log.pub']); heavy = sorted(m for m in ('torch', 'numpy', 'mlflow', 'prefect', 'dvc') if m in "
              "sys.modules); print(status, heavy)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert done.stdout.strip().endswith("0 []"), done.stdout + done.stderr
    hint = key.split("+")[1]
    assert f"(key ID {hint})" in done.stdout
    assert run_verify(tmp_path, monkeypatch, receipt, key, "--key-id", hint)[0] == 0
    status, out = run_verify(tmp_path, monkeypatch, receipt, key, "--key-id", "00000000")
    assert status == 11 and f"has key ID {hint}" in out and out.count("\n") == 1


def test_ids_are_read_as_request_reads_them(workspace, tmp_path, monkeypatch):
    Ledger(workspace / LEDGER_PATH).append([entry("r1", ["toy-00002", "toy-00001"])])
    receipt = build_receipt(sync_workspace(workspace), "r1")
    key = (workspace / LOG_DIR / "log.pub").read_text()
    for listed in ("toy-00001\ntoy-00002\n", "toy-00002,toy-00001", "toy-00001, toy-00002 toy-00001\r\n"):
        (tmp_path / "ids.txt").write_text(listed)
        status, out = run_verify(tmp_path, monkeypatch, receipt, key, "--ids", str(tmp_path / "ids.txt"))
        assert status == 0 and "the 2 sample IDs given are the ones" in out, (listed, out)
    (tmp_path / "ids.txt").write_text("toy-00001")
    assert run_verify(tmp_path, monkeypatch, receipt, key, "--ids", str(tmp_path / "ids.txt"))[0] == 12
    assert canonical_ids(["b", "a", "b"]) == b'["a","b"]'
