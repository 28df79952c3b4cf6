"""Deletion requests, the data plane of the right to be forgotten (pure Python, no orchestration).

    model     the request (kind sample | class | client, subject, scenario) and its parsing
    inbox     safe reading of request files; filing into processed/ or quarantine/
    catalog   the scenario's current data (partition minus ledger) and request resolution
    ledger    the append-only, idempotent ledger of applied requests
    batch     triage, the batch plan (duplicates merged) and the batch record / journal
    erasure   fingerprints of deleted rows and the scan that proves their bytes are gone
    folders   the on-disk layout, the batch lock and durable file operations
"""

from fedunlearn.requests.model import DeletionRequestModel, RequestError, RequestKind

__all__ = ["DeletionRequestModel", "RequestError", "RequestKind"]
