"""The deletion ledger as a transparency log: an RFC 9162 Merkle log over the ledger's
entries and later statements, tree heads signed as C2SP checkpoints with the workspace's Ed25519
key, and receipts a data subject verifies alone.

* ``merkle``: RFC 9162 §2.1 tree hashing, inclusion and consistency proofs and their verification;
* ``note``: the workspace's key, C2SP signed notes and ``tlog-checkpoint`` tree heads;
* ``log``: the log's files in a workspace, kept in step with the ledger and the batch receipts;
* ``proofs``: the receipt file (C2SP ``tlog-proof``) and its verification, which needs no workspace.

Pure: files, ``hashlib`` and ``cryptography``; no orchestration (docs/requests-and-ledger.md).
"""
