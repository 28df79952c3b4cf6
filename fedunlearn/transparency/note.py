"""The log's key and its signed tree heads: C2SP ``signed-note`` Ed25519 signatures over C2SP
``tlog-checkpoint`` texts (origin, tree size, base64 root hash), so that any checkpoint tool or
witness reads them. The signature itself is ``cryptography``'s Ed25519; this module only frames
the bytes as the specifications say.

The public key is written as a signed-note verifier key (``vkey``) line,
``<name>+<key ID, 8 hex digits>+<base64(0x01 || 32-byte public key)>``: the name is the log's
origin, so a key cannot be taken for another log's.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedunlearn.transparency.failures import ReceiptMalformed, SignatureInvalid
from fedunlearn.transparency.merkle import HASH_SIZE
from fedunlearn.transparency.untrusted import CONTROL, canonical_number, strict_b64

ED25519 = b"\x01"  # the signed-note signature type of Ed25519
EM_DASH = "\u2014"
VALID_NAME = re.compile(r"[^\s+]{1,255}")  # signed-note: a key name is non-empty, without spaces or "+"
KEY_HINT = re.compile(r"[0-9a-f]{8}")
MAX_SIGNATURES = 100  # the log and a handful of witnesses; a note is no place to pile up lines
MAX_SIGNATURE_CHARS = 8192  # base64; Ed25519 cosignatures take about a hundred


def key_id(name: str, public: bytes) -> bytes:
    """The signed-note key ID: SHA-256(name || 0x0A || 0x01 || public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + ED25519 + public).digest()[:4]


def _check_name(name: str) -> str:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise ValueError(f"{name!r} cannot name a log: a key name is non-empty, without spaces or '+'")
    return name


@dataclass(frozen=True)
class Verifier:
    name: str
    public: bytes  # 32 bytes, RFC 8032 encoding

    @property
    def key_id(self) -> bytes:
        return key_id(self.name, self.public)

    def vkey(self) -> str:
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(ED25519 + self.public).decode()}"

    def verifies(self, text: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, text)
            return True
        except InvalidSignature:
            return False


def parse_vkey(line: str, source: str = "the public key") -> Verifier:
    """A verifier key line (one line, with or without its newline), every field canonical;
    anything else is ``ReceiptMalformed`` naming ``source``."""
    body = line[:-1] if line.endswith("\n") else line
    name, hint, encoded = ((body.split("+", 2) + ["", ""])[:3])  # the base64 key may hold "+" itself
    try:
        raw = strict_b64(encoded, source, "the key", 33)
    except ReceiptMalformed:
        raw = b""
    if "\n" in body or not VALID_NAME.fullmatch(name) or not KEY_HINT.fullmatch(hint) or raw[:1] != ED25519 \
            or bytes.fromhex(hint) != key_id(name, raw[1:]):
        raise ReceiptMalformed(f"{source} is not an Ed25519 verifier key line (name+keyid+base64 key, one line, "
                               "its key ID matching its name and key, as in data/transparency/log.pub); copy that "
                               "file as it is")
    return Verifier(name, raw[1:])


@dataclass(frozen=True)
class Signer:
    name: str
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, name: str) -> "Signer":
        return cls(_check_name(name), Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, name: str, pem: bytes) -> "Signer":
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("the log's private key is not an Ed25519 key")
        return cls(_check_name(name), key)

    def pem(self) -> bytes:
        return self.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())

    @property
    def verifier(self) -> Verifier:
        public = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return Verifier(self.name, public)

    def sign_note(self, text: str) -> str:
        """``text`` (ending in a newline) as a signed note with this key's signature line."""
        signature = self.private.sign(text.encode())
        line = base64.b64encode(self.verifier.key_id + signature).decode()
        return f"{text}\n{EM_DASH} {self.name} {line}\n"


@dataclass(frozen=True)
class Checkpoint:
    """A tree head: the log's origin, its size and its RFC 9162 root hash."""

    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse(cls, text: str, source: str) -> "Checkpoint":
        """The note text of a C2SP checkpoint: origin, size, root, then extension lines, each
        non-empty and ending in a newline; the size canonical, the root canonical base64."""
        lines = text[:-1].split("\n") if text.endswith("\n") else []
        if len(lines) < 3 or not all(lines):
            raise ReceiptMalformed(f"{source}: the tree head is not a checkpoint (origin, size, base64 root hash, "
                                   "each on its own line)")
        size = canonical_number(lines[1], source, "the tree size")
        return cls(lines[0], size, strict_b64(lines[2], source, "the root hash", HASH_SIZE))


def split_note(note: str, source: str) -> tuple[str, list[tuple[str, bytes]]]:
    """A signed note's text (with its final newline) and its signature lines (name, bytes), read
    as C2SP signed-note says: the text, an empty line, then lines ``— <name> <base64>``, the note
    ending in a newline, no control character but the newline anywhere."""
    if not isinstance(note, str) or "\n\n" not in note or not note.endswith("\n") or CONTROL.search(note):
        raise ReceiptMalformed(f"{source}: not a signed note (a text, an empty line, signature lines, each ending in "
                               "a newline, no control characters)")
    text, _, signed = note.rpartition("\n\n")
    lines = signed[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise ReceiptMalformed(f"{source}: the signed note has {len(lines)} signature lines, more than "
                               f"{MAX_SIGNATURES}")
    signatures = []
    for line in lines:
        dash, name, encoded = (line.split(" ") + ["", ""])[:3] if line.count(" ") == 2 else ("", "", "")
        if dash != EM_DASH or not VALID_NAME.fullmatch(name) or len(encoded) > MAX_SIGNATURE_CHARS:
            raise ReceiptMalformed(f"{source}: the line {line[:40]!r} is not a note signature (— name base64)")
        raw = strict_b64(encoded, source, f"the signature of {name[:40]!r}")
        if len(raw) < 5:
            raise ReceiptMalformed(f"{source}: the signature of {name[:40]!r} is too short to hold a key ID and a "
                                   "signature")
        signatures.append((name, raw))
    return text + "\n", signatures


def open_checkpoint(note: str, verifier: Verifier, source: str) -> Checkpoint:
    """The checkpoint of a signed note, once the signature by ``verifier`` on it checks out and
    its origin is the key's name. A note with no signature by this key, or a failing one, is
    ``SignatureInvalid``; signatures by other keys (witnesses) are ignored, as signed-note says."""
    text, signatures = split_note(note, source)
    checkpoint = Checkpoint.parse(text, source)
    mine = [raw for name, raw in signatures if name == verifier.name and raw[:4] == verifier.key_id]
    if not mine:
        raise SignatureInvalid(f"{source}: the tree head is not signed by the key given ({verifier.name}, key ID "
                               f"{verifier.key_id.hex()}): another log's key, or not this log's tree head")
    if not all(verifier.verifies(text.encode(), raw[4:]) for raw in mine):
        raise SignatureInvalid(f"{source}: the signature on the tree head does not verify with the key given: the "
                               "tree head was changed after it was signed, or signed by another key of that name")
    if checkpoint.origin != verifier.name:
        raise SignatureInvalid(f"{source}: the tree head is of log {checkpoint.origin!r}, the key of {verifier.name!r}")
    return checkpoint
