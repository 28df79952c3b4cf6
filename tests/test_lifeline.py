"""A child started through ``fedunlearn.lifeline`` dies with its parent, however the parent dies
(SIGKILL runs no cleanup), and a plain child does not — the orphan the lifeline prevents. A guarded
child takes every process it started with it (Flower's SuperLink and SuperNodes start the rest of a
deployment), where the plain lifeline leaves the command's own children behind."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fedunlearn import lifeline

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
# The command: starts a sleeper of its own, prints its PID and the sleeper's, then sleeps.
COMMAND = textwrap.dedent("""
    import os, subprocess, sys, time
    own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print(os.getpid(), own.pid, flush=True)
    time.sleep(float(sys.argv[1]))
""")
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from fedunlearn import lifeline
    command = [sys.executable, "-c", sys.argv[2], sys.argv[3]]
    wrap = {"lifeline": lifeline.command, "guard": lifeline.guarded, "plain": list}[sys.argv[1]]
    subprocess.Popen(wrap(command))
    time.sleep(60)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def survivors(pids: list[int], wait_s: float) -> list[int]:
    """Those of ``pids`` still alive once the first is gone (and a moment for the rest), or after
    ``wait_s`` seconds; killed then, so no test leaves any."""
    deadline = time.monotonic() + wait_s
    while alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the rest of the tree goes within a moment of the command, if it goes
    left = [pid for pid in pids if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def left_after_parent_killed(mode: str, wait_s: float) -> list[str]:
    """Which of the command and its own child outlive the SIGKILLed parent that started the command
    ``mode``-wrapped."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode, COMMAND, "60"], stdout=subprocess.PIPE, text=True)
    command, own = (int(pid) for pid in parent.stdout.readline().split())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    left = survivors([command, own], wait_s)
    return [name for name, pid in (("command", command), ("its child", own)) if pid in left]


@LINUX
def test_a_lifeline_child_dies_with_its_killed_parent_and_a_plain_one_does_not():
    assert left_after_parent_killed("plain", wait_s=1.0) == ["command", "its child"]
    # The death signal is not inherited: the command dies, the process it started lives on.
    assert left_after_parent_killed("lifeline", wait_s=5.0) == ["its child"]


@LINUX
def test_a_guarded_command_dies_with_its_killed_parent_and_so_do_its_children():
    assert left_after_parent_killed("guard", wait_s=5.0) == []


@LINUX
def test_a_guard_exits_as_its_command_did_and_ends_what_the_command_left():
    for script, expected in (("raise SystemExit(3)", 3), ("import os, signal; os.kill(os.getpid(), 9)", -9)):
        done = subprocess.run(lifeline.guarded([sys.executable, "-c", script]), timeout=30)
        assert done.returncode == expected, script
    run = subprocess.Popen(lifeline.guarded([sys.executable, "-c", COMMAND, "0"]), stdout=subprocess.PIPE, text=True)
    _, own = (int(pid) for pid in run.stdout.readline().split())
    assert run.wait(timeout=30) == 0
    assert not alive(own)  # orphaned by the command's exit, ended by the guard (no wait: gone before it exits)


@LINUX
def test_a_guard_told_to_stop_ends_its_tree():
    run = subprocess.Popen(lifeline.guarded([sys.executable, "-c", COMMAND, "60"]), stdout=subprocess.PIPE, text=True)
    command, own = (int(pid) for pid in run.stdout.readline().split())
    run.terminate()
    assert run.wait(timeout=30) == -signal.SIGTERM
    assert not alive(command) and not alive(own)


def test_the_lifeline_refuses_a_malformed_call():
    for argv in (["123", "sleep", "1"], ["--guard", "123", "sleep"], ["--guard", "x", "--", "sleep"]):
        with pytest.raises(SystemExit, match="usage"):
            lifeline.main(argv)
