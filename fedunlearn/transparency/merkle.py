"""RFC 9162 §2.1 Merkle tree hashing (the same as RFC 6962 §2.1), inclusion and consistency
proofs, and their verification.

Written here rather than taken from a library: pymerkle 7.0.0, the maintained library that
computes these, pins ``cachetools==7.2.1`` exactly, and our constraints pin ``cachetools==7.3.2``
(Prefect and MLflow need it; pip's resolver reports ResolutionImpossible), pymerkle 6.1.0 pins
``cachetools==5.3.1``; no other maintained Python package computes RFC 6962 consistency proofs
(sigstore verifies inclusion only, in a private module). So the definitions of RFC 9162 §2.1.1
(MTH), §2.1.3 (PATH) and §2.1.4 (PROOF/SUBPROOF) and the verification algorithms of §2.1.3.2 and
§2.1.4.2 are followed line by line, and tests/test_transparency_log.py checks them against the
Certificate Transparency test vectors (roots of sizes 0..8, inclusion and consistency proofs)
and every proof of every pair of sizes up to 40 against mangled ones. Only SHA-256 (hashlib)
is used; nothing here is a signature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

HASH_SIZE = 32
LEAF_PREFIX = b"\x00"  # domain separation of leaves from interior nodes: no second preimage by
NODE_PREFIX = b"\x01"  # presenting an interior node as a leaf (RFC 9162 §2.1.1)


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1): where RFC 9162 splits a tree."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH over leaf hashes (RFC 9162 §2.1.1): the empty tree's is SHA-256 of nothing."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = _split(n)
    return node_hash(root(leaves[:k]), root(leaves[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(index, D[n]) (RFC 9162 §2.1.3.1), from the leaf's sibling up."""
    n = len(leaves)
    if not 0 <= index < n:
        raise ValueError(f"leaf {index} is not in a tree of {n} leaves")
    if n == 1:
        return []
    k = _split(n)
    if index < k:
        return inclusion_proof(leaves[:k], index) + [root(leaves[k:])]
    return inclusion_proof(leaves[k:], index - k) + [root(leaves[:k])]


def consistency_proof(leaves: Sequence[bytes], old_size: int) -> list[bytes]:
    """PROOF(m, D[n]) (RFC 9162 §2.1.4.1): that the first ``old_size`` leaves are a prefix."""
    if not 0 < old_size <= len(leaves):
        raise ValueError(f"no consistency proof from size {old_size} to size {len(leaves)}")
    return _subproof(old_size, leaves, True)


def _subproof(m: int, leaves: Sequence[bytes], complete: bool) -> list[bytes]:
    n = len(leaves)
    if m == n:
        return [] if complete else [root(leaves)]
    k = _split(n)
    if m <= k:
        return _subproof(m, leaves[:k], complete) + [root(leaves[k:])]
    return _subproof(m - k, leaves[k:], False) + [root(leaves[:k])]


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], expected_root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: whether ``leaf`` (a leaf hash) is leaf ``index`` of the tree of
    ``size`` leaves whose root is ``expected_root``."""
    if not 0 <= index < size or not _hashes(leaf, expected_root, *proof):
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:  # up the right border: those levels have no sibling
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == expected_root


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: whether the tree of ``old_size`` leaves with ``old_root`` is a prefix
    of the tree of ``new_size`` leaves with ``new_root``. Equal sizes need an empty proof and
    equal roots; the empty tree is a prefix of every tree."""
    if not 0 <= old_size <= new_size or not _hashes(old_root, new_root, *proof):
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    if old_size == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old tree is a whole subtree of the new
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == old_root and sr == new_root and sn == 0


def _hashes(*values: bytes) -> bool:
    return all(isinstance(v, bytes) and len(v) == HASH_SIZE for v in values)


def prefix_roots(leaves: Sequence[bytes], sizes: Sequence[int]) -> dict[int, bytes]:
    """MTH of each prefix ``leaves[:size]``, in one pass: every signed head is checked against
    the leaves before a new one is signed, and recomputing each root from scratch would cost the
    number of heads times the log's size. Keeps the perfect subtrees of the prefix read so far
    (its binary decomposition, largest first) and folds them from the right (RFC 9162 §2.1.1)."""
    found: dict[int, bytes] = {}
    stack: list[tuple[int, bytes]] = []  # (height, hash) of the prefix's perfect subtrees, left to right
    position = 0
    for size in sorted({s for s in sizes if 0 <= s <= len(leaves)}):
        while position < size:
            height, node = 0, leaves[position]
            while stack and stack[-1][0] == height:
                node = node_hash(stack.pop()[1], node)
                height += 1
            stack.append((height, node))
            position += 1
        folded = stack[-1][1] if stack else hashlib.sha256(b"").digest()
        for _, left in reversed(stack[:-1]):
            folded = node_hash(left, folded)
        found[size] = folded
    return found
