"""Child processes that die with the process that started them.

A process killed with SIGKILL runs no cleanup: its children are re-parented to PID 1 and live on
(Prefect's temporary server kept its port and the workspace's database after 7 of 8 kills of
``fedunlearn process``). Linux's ``PR_SET_PDEATHSIG`` asks the kernel to signal a process when
its parent dies. It must be set by the child itself, so children are started through this module:

    python -m fedunlearn.lifeline <parent pid> -- <command ...>

sets the death signal (SIGKILL: certain, and the servers we start keep their state in sqlite,
which survives it), exits at once if the parent is already gone (it may have died before the
signal was armed), then ``exec``s the command, which keeps the setting. The signal follows the
*thread* that forked the child: start children from the main thread, or from a thread that
outlives them. Elsewhere than Linux the command runs without the lifeline.

The death signal is not inherited: a command that starts processes of its own (Flower's SuperLink
starts the SuperExec and the ServerApp, a SuperNode its ClientApps) would leave them running when
it dies. ``guarded`` wraps such a command in a guard instead,

    python -m fedunlearn.lifeline --guard <parent pid> -- <command ...>

a small process that stays between the two: it is the command's parent (the command dies with it),
a child subreaper (``PR_SET_CHILD_SUBREAPER``: every orphan of the command's tree is re-parented to
it, not to PID 1) and is sent SIGTERM when its own parent dies. Then, or when the command exits, it
SIGKILLs whatever is left of the tree and exits as the command did (status or signal).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GUARD = "--guard"
USAGE = "usage: python -m fedunlearn.lifeline [--guard] <parent pid> -- <command ...>"
END_TREE_S = 10.0  # SIGKILL is not refused: a tree still there after this is left rather than waited on forever


class _Ended(BaseException):
    """The guard was told to end (its parent died, or someone stopped it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def command(args: list[str]) -> list[str]:
    """``args`` wrapped so that the process dies with this one."""
    if not sys.platform.startswith("linux"):
        return list(args)
    return [sys.executable, "-m", "fedunlearn.lifeline", str(os.getpid()), "--", *args]


def guarded(args: list[str]) -> list[str]:
    """``args`` wrapped so that the process, and every process it starts, dies with this one. The
    process started is the guard; the command is its only child."""
    if not sys.platform.startswith("linux"):
        return list(args)
    return [sys.executable, "-m", "fedunlearn.lifeline", GUARD, str(os.getpid()), "--", *args]


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _arm_and_exec(parent: int, args: list[str]) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        raise SystemExit(1)  # the parent died before the death signal was armed
    os.execvp(args[0], args)


def main(argv: list[str]) -> None:
    guard = argv[:1] == [GUARD]
    parent, separator, *args = argv[1:] if guard else argv
    if separator != "--" or not args or not parent.isdigit():
        raise SystemExit(USAGE)
    if guard:
        run_guard(int(parent), args)
    else:
        _arm_and_exec(int(parent), args)


def run_guard(parent: int, args: list[str]) -> None:
    """Start ``args`` as this process's child and stay until it exits or ``parent`` dies (see the
    module's docstring); never returns."""
    def end(signum, _frame):
        raise _Ended(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the command itself, which decides
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # caught: the guard must outlive the signal to end the tree
    guard = os.getpid()
    try:
        if os.getppid() != parent:
            raise _Ended(signal.SIGTERM)  # the parent died before the death signal was armed
        child = os.fork()
        if child == 0:
            _exec_child(guard, args)
        _, status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(status)
    except _Ended as ended:
        code = -ended.signum
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    end_tree(guard)
    _exit_as(code)


def _exec_child(guard: int, args: list[str]) -> None:
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        _arm_and_exec(guard, args)
    except BaseException as err:  # noqa: BLE001 - a forked child must never return into the guard's code
        print(f"fedunlearn.lifeline: cannot start {args[0]}: {err}", file=sys.stderr, flush=True)
    os._exit(127)


def end_tree(root: int, within_s: float = END_TREE_S) -> None:
    """SIGKILL every live descendant of ``root`` (this process) and reap them; repeated while any
    is left, as a killed process's own children come to the subreaper ``root`` only once it died."""
    deadline = time.monotonic() + within_s
    while True:
        left = descendants(root)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap()
        if not left or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes below ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _exit_as(code: int) -> None:
    """Exit with the command's status: its exit code, or killed by the signal that killed it."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two whose action is fixed
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main(sys.argv[1:])
