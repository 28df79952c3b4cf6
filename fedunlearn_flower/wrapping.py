"""A method over Flower is its in-process method's protocol as messages: one definition of its settings.

Each strategy names its in-process class (``in_process``, from ``fedunlearn.unlearning``). The
settings a caller gives are that class's — named, defaulted and validated there, its docstring
listing each with its default — and the strategy holds the configured in-process method as
``self.method``, whose client code and server arithmetic the messages run. ``pinned`` names the
settings the Flower protocol runs at one value only (a step it does not offer): another value is
refused with the runtime that runs it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from fedunlearn.unlearning.base import UnlearningMethod
from fedunlearn.unlearning.registry import get_method


class OverFlower:
    """The base of a Flower strategy that wraps an in-process method (module docstring)."""

    in_process: ClassVar[type[UnlearningMethod]]
    pinned: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any):
        for name, value in self.pinned.items():
            if params.get(name, value) != value:
                raise ValueError(f"{self.in_process.name} over Flower: {name}={params[name]!r} runs in-process only "
                                 f"(use the in-process runtime, or {name}={value!r})")
        # The registry's constructor: an unknown setting is named with the ones the method accepts.
        self.method = get_method(self.in_process.name, setting="hfl", **{**params, **self.pinned})

    @classmethod
    def options(cls) -> set[str]:
        """The settings a caller may name: the in-process method's, but those pinned at its default
        (a step not offered here); one pinned elsewhere (FedQUIT's ``solver``) is named at its value."""
        defaults = cls.in_process.defaults()
        return {name for name in defaults if name not in cls.pinned or cls.pinned[name] != defaults[name]}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.method!r})"
