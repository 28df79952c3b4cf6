"""What a receipt check can find, one class and one exit status per kind (defined with the
others in ``fedunlearn.errors``, listed in the README), so that a script a data subject runs tells
them apart:

    10 ReceiptMalformed   the file is not a receipt, a tree head or a key this command reads
    11 SignatureInvalid   the tree head is not signed by the key given (forged, or another log's)
    12 NotIncluded        the entry is not in the log the signed tree head commits to
    13 LogInconsistent    the newer tree head does not extend the older one: the log was rewritten
    4  LogRewritten       (operator side) the Merkle log and the ledger disagree; nothing was signed
"""

from __future__ import annotations

from fedunlearn.errors import LogInconsistent, NotIncluded, ReceiptMalformed, SignatureInvalid, StateDamaged

__all__ = ["LogInconsistent", "LogRewritten", "NotIncluded", "ReceiptMalformed", "SignatureInvalid"]


class LogRewritten(StateDamaged):
    """The ledger no longer reads as the history the log's signed heads commit to: signing a head
    over it would sign a rewritten history, so nothing is signed until an operator decides."""
