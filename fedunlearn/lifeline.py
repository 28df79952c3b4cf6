"""Child processes that die with the process that started them.

A process killed with SIGKILL runs no cleanup: its children are re-parented to PID 1 and live on
(Prefect's temporary server kept its port and the workspace's database after 7 of 8 kills of
``fedunlearn process``). Linux's ``PR_SET_PDEATHSIG`` asks the kernel to signal a process when
its parent dies. It must be set by the child itself, so children are started through this module:

    python -m fedunlearn.lifeline <parent pid> -- <command ...>

sets the death signal (SIGKILL: certain, and the servers we start keep their state in sqlite,
which survives it), exits at once if the parent is already gone (it may have died before the
signal was armed), then ``exec``s the command, which keeps the setting. The signal follows the
*thread* that forked the child: start children from the main thread. Elsewhere than Linux the
command runs without the lifeline.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def command(args: list[str]) -> list[str]:
    """``args`` wrapped so that the process dies with this one."""
    if not sys.platform.startswith("linux"):
        return list(args)
    return [sys.executable, "-m", "fedunlearn.lifeline", str(os.getpid()), "--", *args]


def main(argv: list[str]) -> None:
    parent, separator, *args = argv
    if separator != "--" or not args:
        raise SystemExit("usage: python -m fedunlearn.lifeline <parent pid> -- <command ...>")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(parent):
        raise SystemExit(1)  # the parent died before the death signal was armed
    os.execvp(args[0], args)


if __name__ == "__main__":
    main(sys.argv[1:])
