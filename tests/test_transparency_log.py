"""The ledger's Merkle log (issue 39) without training: RFC 6962/9162 hashing and proofs against the
Certificate Transparency test vectors, signed checkpoints, receipts verified in a directory that
holds nothing else, and every kind of damage or dishonesty failing with its own message and exit
status. The batch on digits-hfl is tests/test_receipts_acceptance.py."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from cli import main
from fedunlearn.requests.ledger import LEDGER_PATH, Ledger, LedgerEntry
from fedunlearn.transparency import merkle
from fedunlearn.transparency.failures import LogRewritten
from fedunlearn.transparency.log import LOG_DIR, TransparencyLog, read_verifier, sync_workspace
from fedunlearn.transparency.note import Checkpoint, Signer, open_checkpoint, parse_vkey
from fedunlearn.transparency.proofs import build_receipt, verify_receipt
from workspaces import call_cli

# Certificate Transparency's reference leaves and the RFC 6962 roots of sizes 0..8 (also used by
# transparency-dev/merkle and every CT implementation): a tree no other implementation agrees with
# would prove nothing to a data subject.
CT_LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                        "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = ["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
            "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
            "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
            "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]
CT_INCLUSION = {(0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                         "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                         "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
                (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                         "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                         "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]}
CT_CONSISTENCY = {(2, 8): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                           "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
                  (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                           "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                           "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
                  (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                           "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]}


def test_roots_and_proofs_are_rfc_6962s():
    leaves = [merkle.leaf_hash(d) for d in CT_LEAVES]
    assert [merkle.root(leaves[:n]).hex() for n in range(9)] == CT_ROOTS
    for (index, size), expected in CT_INCLUSION.items():
        proof = merkle.inclusion_proof(leaves[:size], index)
        assert [h.hex() for h in proof] == expected
        assert merkle.verify_inclusion(leaves[index], index, size, proof, bytes.fromhex(CT_ROOTS[size]))
    for (old, new), expected in CT_CONSISTENCY.items():
        proof = merkle.consistency_proof(leaves[:new], old)
        assert [h.hex() for h in proof] == expected
        assert merkle.verify_consistency(old, new, bytes.fromhex(CT_ROOTS[old]), bytes.fromhex(CT_ROOTS[new]), proof)


def test_every_proof_of_every_size_verifies_and_no_mangled_one_does():
    leaves = [merkle.leaf_hash(i.to_bytes(2, "big")) for i in range(24)]
    roots = [merkle.root(leaves[:n]) for n in range(len(leaves) + 1)]
    flip = lambda h: bytes([h[0] ^ 1]) + h[1:]  # noqa: E731
    for n in range(1, len(leaves) + 1):
        for i in range(n):
            proof = merkle.inclusion_proof(leaves[:n], i)
            assert merkle.verify_inclusion(leaves[i], i, n, proof, roots[n])
            assert not merkle.verify_inclusion(leaves[i], (i + 1) % n, n, proof, roots[n]) or n == 1
            assert not merkle.verify_inclusion(flip(leaves[i]), i, n, proof, roots[n])
            assert not proof or not merkle.verify_inclusion(leaves[i], i, n, proof[:-1], roots[n])
        for m in range(1, n + 1):
            proof = merkle.consistency_proof(leaves[:n], m)
            assert merkle.verify_consistency(m, n, roots[m], roots[n], proof)
            assert m == n or not merkle.verify_consistency(m, n, flip(roots[m]), roots[n], proof)
            assert not proof or not merkle.verify_consistency(m, n, roots[m], roots[n], [flip(proof[0])] + proof[1:])
            assert not proof or not merkle.verify_consistency(m, n, roots[m], roots[n], proof[:-1])


def test_a_checkpoint_is_a_c2sp_signed_note_that_only_its_key_opens():
    signer, other = Signer.generate("example.invalid/log"), Signer.generate("example.invalid/log")
    note = signer.sign_note(Checkpoint("example.invalid/log", 8, bytes.fromhex(CT_ROOTS[8])).text())
    text, _, signature = note.partition("\n\n")
    assert text == "example.invalid/log\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg="
    assert signature.startswith("\u2014 example.invalid/log ") and len(base64.b64decode(signature.split()[-1])) == 68
    assert open_checkpoint(note, parse_vkey(signer.verifier.vkey()), "head").size == 8
    with pytest.raises(Exception, match="not signed by the key given"):
        open_checkpoint(note, other.verifier, "head")
    with pytest.raises(Exception, match="does not verify"):
        open_checkpoint(note.replace("\n8\n", "\n9\n"), signer.verifier, "head")


def entry(request_id: str, ids: list[str], batch: str = "b1") -> LedgerEntry:
    return LedgerEntry(request_id=request_id, batch_id=batch, scenario="toy-hfl", kind="sample",
                       subject={"sample_ids": ids}, sample_ids=ids)


@pytest.fixture
def logged(workspace):
    """A workspace whose ledger holds three requests, logged and signed; r1's receipt."""
    Ledger(workspace / LEDGER_PATH).append([entry("r1", ["a", "b"]), entry("r2", ["c"]), entry("r3", ["d"], "b2")])
    log = sync_workspace(workspace)
    return workspace, log, build_receipt(log, "r1")


def verify_alone(tmp_path: Path, monkeypatch, receipt: str, key: str, *extra: tuple[str, str]) -> tuple[int, str]:
    """`fedunlearn verify-receipt` in a directory holding only the receipt, the key and ``extra``."""
    alone = tmp_path / "subject"
    alone.mkdir(parents=True, exist_ok=True)
    for stale in alone.iterdir():
        stale.unlink()
    for name, text in [("receipt.tlog-proof", receipt), ("log.pub", key), *extra]:
        (alone / name).write_text(text)
    monkeypatch.chdir(alone)
    monkeypatch.delenv("FEDUNLEARN_ROOT", raising=False)
    since = ["--since", extra[0][0]] if extra else []
    printed = call_cli(alone, "verify-receipt", "receipt.tlog-proof", "--public-key", "log.pub", *since)
    assert sorted(os.listdir(alone)) == sorted(["receipt.tlog-proof", "log.pub", *[n for n, _ in extra]])
    return printed.status, printed.out + printed.err


def test_a_receipt_verifies_alone_and_each_forgery_fails_with_its_own_status(logged, tmp_path, monkeypatch):
    workspace, log, receipt = logged
    key = (workspace / LOG_DIR / "log.pub").read_text()
    status, out = verify_alone(tmp_path, monkeypatch, receipt, key)
    assert status == 0 and "request r1 is leaf 0" in out and "VERIFIED" in out, out
    assert '"a"' not in base64.b64decode(receipt.split("\n")[1][6:]).decode()  # IDs only as a commitment

    other = Signer.generate(read_verifier(workspace).name)
    head = Checkpoint.parse(log.head().split("\n\n")[0] + "\n", "head")
    forged_head = receipt.replace(log.head(), other.sign_note(head.text()))
    assert verify_alone(tmp_path, monkeypatch, forged_head, key)[0] == 11
    assert verify_alone(tmp_path, monkeypatch, receipt, other.verifier.vkey() + "\n")[0] == 11
    moved = receipt.replace("\nindex 0\n", "\nindex 1\n")
    status, out = verify_alone(tmp_path, monkeypatch, moved, key)
    assert status == 12 and "is NOT in the log" in out
    status, out = verify_alone(tmp_path, monkeypatch, "not a receipt\n", key)
    assert status == 10 and "is not a receipt" in out


def test_the_ids_commitment_opens_with_the_salt_for_the_subjects_ids_only(logged):
    workspace, _, receipt = logged
    assert "commitment" in verify_receipt(receipt, read_verifier(workspace), "r", sample_ids=["b", "a"])[-1]
    with pytest.raises(Exception, match="do NOT match the commitment") as raised:
        verify_receipt(receipt, read_verifier(workspace), "r", sample_ids=["a", "c"])
    assert raised.value.exit_code == 12


def rewrite_ledger(workspace: Path, keep) -> None:
    """The ledger rewritten into another, intact-looking history (re-chained): what only the Merkle log catches."""
    ledger = Ledger(workspace / LEDGER_PATH)
    entries = keep(ledger.entries())
    ledger.path.write_text("")
    ledger.append([e.model_copy(update={"checksum": None, "prev_hash": None}) for e in entries])


@pytest.mark.parametrize("keep, message", [
    (lambda es: [es[0].model_copy(update={"sample_ids": ["a"]}), *es[1:]], "commits to another version"),
    (lambda es: [es[1], es[0], es[2]], "entries were reordered"),
    (lambda es: es[1:], "the entry was removed"),
])
def test_a_rewritten_ledger_is_never_signed_and_ledger_verify_names_how(logged, keep, message):
    workspace, log, _ = logged
    rewrite_ledger(workspace, keep)
    with pytest.raises(LogRewritten, match=message):
        sync_workspace(workspace)
    printed = call_cli(workspace, "ledger", "verify")
    assert printed.status == 4 and message in printed.out, printed.out


def test_history_rewritten_and_resigned_fails_ledger_verify_and_the_old_receipt(logged, tmp_path, monkeypatch):
    workspace, log, receipt = logged
    old_head = log.head()
    rewrite_ledger(workspace, lambda es: es[1:])
    with pytest.raises(LogRewritten, match="the entry was removed"):  # the honest program refuses to sign
        sync_workspace(workspace)
    for path in log.directory.glob("*"):  # the dishonest operator rebuilds the log without r1, same key,
        if path.name != "log.pub":  # padded past the size the subject saw
            path.unlink()
    # Padded with entries of its own (a leaf no record backs would be refused: tests/test_log_backing.py).
    Ledger(workspace / LEDGER_PATH).append([entry("r4", ["e"], "b3"), entry("r5", ["f"], "b3")])
    sync_workspace(workspace)
    assert not log.check(Ledger(workspace / LEDGER_PATH).entries()).problems  # self-consistent: copies elsewhere tell
    (tmp_path / "r1.tlog-proof").write_text(receipt)
    out = tmp_path / "proof.tlog-proof"
    printed = call_cli(workspace, "ledger", "prove-consistency", "--since", str(tmp_path / "r1.tlog-proof"),
                       "--out", str(out))
    assert printed.status == 13 and "does not extend the tree head" in printed.err and not out.exists()
    (log.directory / "head-3.checkpoint").write_text(old_head)  # e.g. the copy on the DVC remote, fetched back
    printed = call_cli(workspace, "ledger", "verify")
    assert printed.status == 4 and "head-3.checkpoint (size 3) does not match the log's first 3 leaves" in printed.out
    printed = call_cli(workspace, "ledger", "prove-consistency", "--since", str(tmp_path / "r1.tlog-proof"),
                       "--out", str(out))  # and now that it holds a head the log does not extend, nothing is signed
    assert printed.status == 4 and "nothing was signed" in printed.err and not out.exists()

    # What a modified `prove-consistency` could still hand over: a proof over the rewritten leaves.
    hashes = [r.hash for r in log.records()]
    old = Checkpoint.parse(old_head.split("\n\n")[0] + "\n", "old")
    forged = build_receipt(log, "r2", {"old_size": 3, "old_root": base64.b64encode(old.root).decode(),
                                       "proof": [base64.b64encode(h).decode()
                                                 for h in merkle.consistency_proof(hashes, 3)]})
    key = (workspace / LOG_DIR / "log.pub").read_text()
    status, out = verify_alone(tmp_path, monkeypatch, forged, key, ("old.checkpoint", old_head))
    assert status == 13 and "INCONSISTENT" in out and "the log was rewritten" in out, out
    status, out = verify_alone(tmp_path / "2", monkeypatch, forged, key, ("r1.tlog-proof", receipt))
    assert status == 12 and "is not about the entry" in out, out


def test_ledger_repair_never_signs_a_rewritten_history_silently(logged):
    workspace, log, _ = logged
    rewrite_ledger(workspace, lambda es: es[1:])
    printed = call_cli(workspace, "ledger", "repair")
    assert printed.status == 4 and "Merkle log NOT signed" in printed.out, printed.out + printed.err
    old_origin = read_verifier(workspace).name
    printed = call_cli(workspace, "ledger", "repair", "--new-log")
    assert printed.status == 0 and "NEW MERKLE LOG" in printed.out, printed.out + printed.err
    new_origin = read_verifier(workspace).name
    assert new_origin != old_origin and new_origin.endswith("/generation-2")
    assert json.loads(TransparencyLog(workspace).records()[0].leaf)["request_id"] == "r2"
    assert (log.directory / "retired-1-leaves.jsonl").is_file()


def test_the_batch_and_its_exact_forgetting_are_logged_and_an_honest_log_proves_consistent(logged, tmp_path,
                                                                                          monkeypatch):
    from datetime import datetime, timezone

    from fedunlearn.receipts import ExactForgetting, write_receipt
    from test_receipts import make_receipt

    workspace, log, first = logged
    receipt = make_receipt(promoted=True).model_copy(update={"batch_id": "b1", "request_ids": ["r1", "r2"],
                                                             "forgetting": "interim"})
    write_receipt(workspace, receipt)
    sync_workspace(workspace, lambda scenario, version: f"sha-of-v{version}")
    status, out = verify_alone(tmp_path, monkeypatch, build_receipt(log, "r1"), (log.directory / "log.pub").read_text())
    assert status == 0 and "included: b1 (leaf 3): data version v0 -> v1; serving version 2" in out, out
    assert "model sha256 sha-of-v2" in out and "req-a" not in out

    done = ExactForgetting(at=datetime(2026, 3, 3, tzinfo=timezone.utc), version="4", by="exact retrain")
    write_receipt(workspace, receipt.model_copy(update={"exactly_forgotten": done}))
    sync_workspace(workspace, lambda scenario, version: f"sha-of-v{version}")  # the CLI would ask the registry
    (tmp_path / "first.tlog-proof").write_text(first)
    out_file = tmp_path / "now.tlog-proof"
    # The proof as `ledger prove-consistency` makes it; the command itself would refuse this workspace: no
    # batch record or registered version backs the statements (tests/test_log_backing.py).
    from fedunlearn.transparency.proofs import prove_consistency

    out_file.write_text(prove_consistency(log, first, str(tmp_path / "first.tlog-proof"), None))
    status, out = verify_alone(tmp_path, monkeypatch, out_file.read_text(), (log.directory / "log.pub").read_text(),
                               ("first.tlog-proof", first))
    assert status == 0 and "exact forgetting of b1 (leaf 4)" in out and "(size 3) is a prefix" in out, out
    assert TransparencyLog(workspace).check(Ledger(workspace / LEDGER_PATH).entries()).problems == []


def test_the_receipt_carries_and_verifies_the_retirements_of_the_versions_that_learnt_it(logged, tmp_path,
                                                                                      monkeypatch):
    """The versions the batch's receipt names as retired: their retirement leaves, with inclusion
    proofs, in the subject's file; verify-receipt lists them; a changed one fails as any leaf would."""
    from fedunlearn.receipts import write_receipt
    from fedunlearn.transparency.statements import retirement_leaf
    from test_receipts import make_receipt

    workspace, log, _ = logged
    receipt = make_receipt(promoted=True).model_copy(update={"batch_id": "b1", "request_ids": ["r1", "r2"],
                                                             "scenario": "toy-hfl", "retired": ["1", "2"]})
    write_receipt(workspace, receipt)
    sync_workspace(workspace, lambda scenario, version: f"sha-of-v{version}")
    at = "2026-03-03T00:00:00+00:00"
    log.append_statements([("retirement", f"toy-hfl v{v}", retirement_leaf("toy-hfl", v, "b2", "ab" * 32, at))
                           for v in ("1", "2", "3")])  # v3 learnt b2 only: not r1's
    key = (log.directory / "log.pub").read_text()
    made = build_receipt(log, "r1")
    status, out = verify_alone(tmp_path, monkeypatch, made, key)
    assert status == 0 and "VERIFIED" in out, out
    assert f"included: retirement of toy-hfl v1 (leaf 4) at {at} by b2: weights deleted, weights digest {'ab' * 32}" \
        in out
    assert f"retired: v1, v2 of toy-hfl, the versions that learnt these samples" in out
    assert f"v2 at {at}, weights digest {'ab' * 32}" in out and "toy-hfl v3" not in out

    extra = json.loads(base64.b64decode(made.split("\n")[1][len("extra "):]))
    forged = retirement_leaf("toy-hfl", "1", "b2", "cd" * 32, at)  # another digest than the one logged
    extra["statements"] = [dict(s, leaf=base64.b64encode(forged).decode()) if s["index"] == 4 else s
                           for s in extra["statements"]]
    lines = made.split("\n")
    lines[1] = "extra " + base64.b64encode(json.dumps(extra, sort_keys=True, separators=(",", ":")).encode()).decode()
    status, out = verify_alone(tmp_path, monkeypatch, "\n".join(lines), key)
    assert status == 12 and "the statement at leaf 4 is NOT in the signed log" in out, out


def test_receipt_of_a_batch_id_says_it_is_a_batch_and_names_its_requests(logged, tmp_path):
    from fedunlearn.receipts import write_receipt
    from test_receipts import make_receipt

    workspace, _, _ = logged
    write_receipt(workspace, make_receipt(promoted=True).model_copy(update={"batch_id": "b1",
                                                                            "request_ids": ["r1", "r2"]}))
    printed = call_cli(workspace, "receipt", "b1", "--out", str(tmp_path / "b1.tlog-proof"))
    [error] = [line for line in printed.err.splitlines() if line.startswith("error: ")]
    assert printed.status == 2 and error.startswith("error: b1 is a deletion batch"), printed.err
    assert "b1 is a deletion batch, not a request" in printed.err and "applied 2 request(s)" in printed.err
    assert f"`fedunlearn receipt r2 --out {tmp_path / 'r2.tlog-proof'}`" in printed.err
    assert not (tmp_path / "b1.tlog-proof").exists()
    unknown = call_cli(workspace, "receipt", "nobody", "--out", str(tmp_path / "n.tlog-proof"))
    assert unknown.status == 2 and "is not in the deletion ledger" in unknown.err


def cosign(note: str, name: str, witness: Signer, timestamp: int) -> str:
    """A C2SP tlog-cosignature/v1 line added by a witness (what docs/requests-and-ledger.md describes)."""
    import hashlib

    from cryptography.hazmat.primitives import serialization

    text = note.partition("\n\n")[0] + "\n"
    public = witness.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key_id = hashlib.sha256(name.encode() + b"\n\x04" + public).digest()[:4]
    signature = witness.private.sign(f"cosignature/v1\ntime {timestamp}\n{text}".encode())
    line = base64.b64encode(key_id + timestamp.to_bytes(8, "big") + signature).decode()
    return f"{note}\u2014 {name} {line}\n"


def test_a_witness_checks_consistency_from_its_last_head_and_its_cosignature_is_carried(logged, tmp_path,
                                                                                        monkeypatch):
    workspace, log, receipt = logged
    witnessed = cosign(log.head(), "witness.invalid/w1", Signer.generate("witness.invalid/w1"), 1_790_000_000)
    (tmp_path / "witnessed.checkpoint").write_text(witnessed)
    Ledger(workspace / LEDGER_PATH).append([entry("r4", ["e"], "b3")])
    out = tmp_path / "for-witness.tlog-proof"
    printed = call_cli(workspace, "ledger", "prove-consistency", "--since", str(tmp_path / "witnessed.checkpoint"),
                       "--out", str(out))
    assert printed.status == 0, printed.err
    key = (log.directory / "log.pub").read_text()
    status, text = verify_alone(tmp_path, monkeypatch, out.read_text(), key, ("last.checkpoint", witnessed))
    assert status == 0 and "(size 3) is a prefix of the log in receipt.tlog-proof (size 4)" in text, text
    cosigned = receipt.replace(receipt.partition("\n\n")[2], witnessed)
    status, text = verify_alone(tmp_path, monkeypatch, cosigned, key)
    assert status == 0, text  # a witness's line is ignored by a verifier that does not know the witness


def test_bad_input_is_one_line_naming_what_and_what_to_do(logged, tmp_path, monkeypatch):
    workspace, _, _ = logged
    printed = call_cli(workspace, "receipt", "no-such-request", "--out", str(tmp_path / "r"))
    assert printed.status == 2 and printed.err.count("\n") == 1 and "`fedunlearn status`" in printed.err
    status, out = verify_alone(tmp_path, monkeypatch, "x", "not a key\n")
    assert status == 10 and out.count("\n") == 1 and "copy" in out and "log.pub" in out
    monkeypatch.chdir(tmp_path)
    printed = call_cli(tmp_path, "verify-receipt", "missing.tlog-proof", "--public-key", "log.pub")
    assert printed.status == 2 and "cannot read the public key log.pub" in printed.err


def test_a_leaf_append_cut_off_by_a_crash_is_dropped_and_logged_again(logged):
    workspace, log, _ = logged
    Ledger(workspace / LEDGER_PATH).append([entry("r4", ["e"], "b3")])
    with open(log.leaves_path, "a") as handle:
        handle.write('{"index": 3, "kind": "deletion", "key": "r4", "le')  # SIGKILL mid-append: never signed
    assert len(log.records()) == 3 and log.torn_tail()
    [again] = sync_workspace(workspace).records()[3:]
    assert again.key == "r4" and not log.torn_tail()
    assert not log.check(Ledger(workspace / LEDGER_PATH).entries()).problems
