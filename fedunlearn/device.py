"""Device selection: chosen once, passed down (no `.cuda()` scattered through the code)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import torch

# torch is imported where a device is resolved, not here: the CLI reads DEVICE_CHOICES to build its
# parser, and `fedunlearn --help` should not pay for loading torch.
DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(name: str = "auto") -> torch.device:
    """Return the torch device for ``name``; ``auto`` picks cuda, then mps, then cpu."""
    import torch

    if name not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {name!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; use --device auto or cpu")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps' requested but MPS is not available; use --device auto or cpu")
    return torch.device(name)


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads (None: leave torch's setting), then
    restore the previous number. A scenario's ``threads`` (params.yaml) uses it for small models,
    whose kernels are too short for a second thread to pay for its synchronisation."""
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
