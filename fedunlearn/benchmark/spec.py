"""The request SPEC of ``fedunlearn benchmark``:

* ``client:<id>[,<id>...]`` — whole clients; ``client:largest`` names the client with most samples;
* ``class:<label>[,<label>...]`` — every sample of those classes, at every client;
* ``samples:<fraction>@<client id|all>`` — a seeded fraction of one client's (or every client's)
  samples, e.g. ``samples:0.1@all``; the client may also be ``largest``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from fedunlearn.federation.forget_set import ForgetSet, resolve_request

if TYPE_CHECKING:  # annotations only: parsing a request needs no torch
    from fedunlearn.federation.local import Tensors

REQUEST_FORMS = "client:<id>[,<id>...] | class:<label>[,<label>...] | samples:<fraction>@<client id|all>"


@dataclass(frozen=True)
class RequestSpec:
    text: str
    kind: str
    subject: Any  # list of client ids (may include "largest"), list of labels, or (fraction, clients)

    def resolve(self, clients: Sequence[Tensors], num_classes: int, seed: int) -> ForgetSet:
        largest = max(range(len(clients)), key=lambda c: len(clients[c]))
        if self.kind == "client":
            ids = [largest if c == "largest" else c for c in self.subject]
            return resolve_request("client", ids, clients)
        if self.kind == "class":
            return resolve_request("class", list(self.subject), clients, num_classes=num_classes)
        fraction, where = self.subject
        chosen = (list(range(len(clients))) if where == "all" else [largest if where == "largest" else where])
        return resolve_request("sample", {"clients": chosen, "fraction": fraction, "seed": seed}, clients)


def parse_request(text: str) -> RequestSpec:
    """Parse a SPEC; a malformed one is a ValueError naming the accepted forms."""
    text = text.strip()
    kind, _, rest = text.partition(":")
    if kind == "client" and re.fullmatch(r"(\d+|largest)(,(\d+|largest))*", rest):
        return RequestSpec(text, "client", [c if c == "largest" else int(c) for c in rest.split(",")])
    if kind == "class" and re.fullmatch(r"\d+(,\d+)*", rest):
        return RequestSpec(text, "class", [int(c) for c in rest.split(",")])
    match = re.fullmatch(r"(\d*\.?\d+)@(\d+|all|largest)", rest) if kind == "samples" else None
    if match:
        fraction = float(match.group(1))
        if not 0 < fraction <= 1:
            raise ValueError(f"request {text!r}: the fraction must be in (0, 1]")
        where = match.group(2)
        return RequestSpec(text, "sample", (fraction, where if where in ("all", "largest") else int(where)))
    raise ValueError(f"cannot parse request {text!r}; use {REQUEST_FORMS}")
