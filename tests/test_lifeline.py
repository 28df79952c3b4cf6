"""A child started through ``fedunlearn.lifeline`` dies with its parent, however the parent dies
(SIGKILL runs no cleanup), and a plain child does not — the orphan the lifeline prevents."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from fedunlearn import lifeline

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from fedunlearn import lifeline
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    child = subprocess.Popen(lifeline.command(command) if sys.argv[1] == "lifeline" else command)
    print(child.pid, flush=True)
    time.sleep(60)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def child_after_parent_killed(mode: str, wait_s: float) -> bool:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the lifeline has armed the death signal and exec'd the command
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + wait_s
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    return survived


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_lifeline_child_dies_with_its_killed_parent_and_a_plain_one_does_not():
    assert not child_after_parent_killed("lifeline", wait_s=5.0)
    assert child_after_parent_killed("plain", wait_s=1.0)


def test_the_lifeline_refuses_a_malformed_call():
    with pytest.raises(SystemExit, match="usage"):
        lifeline.main(["123", "sleep", "1"])
