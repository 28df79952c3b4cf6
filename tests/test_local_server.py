"""The command's own Prefect server (``runtime.local_server``), without Prefect: two commands
starting at once never start their servers on the same port, and a server that exited on its own is
remembered for the command's error line and ends the command the moment it exits (issue 51: the
flows' retries against a server that was gone took 139 s)."""

import socket
import subprocess
import sys
import threading
import time

import pytest

from runtime.local_server import connection_lost, exited_early, start_listening, stop, watch_exit

# A stand-in for `prefect server start`: like it, it binds its port only after a start-up delay.
LATE_BINDER = ("import socket, sys, time; time.sleep(0.5); s = socket.socket(); "
               "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)")


def two_free_ports() -> list[int]:
    probes = [socket.socket() for _ in range(2)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    ports = sorted(probe.getsockname()[1] for probe in probes)
    for probe in probes:
        probe.close()
    return ports


def listening(process: subprocess.Popen, port: int) -> None:
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server on {port} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)


def test_two_commands_starting_at_once_get_different_ports():
    candidates = two_free_ports()

    def first_bindable() -> int:
        """As the kernel does: the port a probe just released is handed to the next probe."""
        for port in candidates:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise AssertionError("no candidate port left")

    def start(port: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", LATE_BINDER, str(port)])

    started, failed = [], []

    def command() -> None:
        try:
            started.append(start_listening(start, listening, timeout_s=30, choose=first_bindable))
        except Exception as err:  # the loser of a collision: its server cannot bind
            failed.append(err)

    threads = [threading.Thread(target=command) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    try:
        assert not failed and sorted(port for port, _ in started) == candidates
        assert all(process.poll() is None for _, process in started)
    finally:
        for _, process in started:
            stop(process)


def test_a_server_that_exited_on_its_own_is_remembered_once():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    stop(process, log=None)  # no log: not the command's own server
    assert exited_early() is None
    stop(process, log=__file__)
    assert exited_early() == (3, __file__) and exited_early() is None


def test_a_connection_cut_is_found_behind_the_errors_that_wrap_it():
    import httpx

    try:
        try:
            raise httpx.ConnectError("All connection attempts failed")
        except httpx.ConnectError as cut:
            raise RuntimeError("task run failed") from cut
    except RuntimeError as wrapped:
        assert isinstance(connection_lost(wrapped), httpx.ConnectError)
    assert connection_lost(ValueError("bad input")) is None


def test_an_exit_is_news_at_once_unless_the_server_was_being_stopped(tmp_path):
    calls: list[float] = []
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watch_exit(server, tmp_path / "server.log", lambda: calls.append(time.monotonic()))
    server.kill()
    killed = time.monotonic()
    server.wait()
    deadline = killed + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(calls) == 1 and calls[0] - killed < 2.0
    assert exited_early() == (-9, tmp_path / "server.log")
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopping = watch_exit(stopped, tmp_path / "other.log", lambda: calls.append(time.monotonic()))
    stopping.set()
    stop(stopped)
    time.sleep(1.0)  # two polls of the watcher
    assert len(calls) == 1 and exited_early() is None


def test_the_command_line_ends_in_one_error_line_when_its_server_exits(tmp_path, monkeypatch, capsys):
    import cli
    from cli import common
    from runtime import local_server

    monkeypatch.setattr(cli, "leave_now", lambda code: (_ for _ in ()).throw(SystemExit(code)))
    monkeypatch.setattr(common, "_ON_OWN_SERVER_EXIT", [])
    common.leave_when_own_server_exits("`fedunlearn process`", tmp_path)
    monkeypatch.setattr(local_server, "_EXITED", [(-9, tmp_path / "server.log")])
    with pytest.raises(SystemExit) as left:
        common._ON_OWN_SERVER_EXIT[0]()
    assert left.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the command's own Prefect server stopped"), err
    assert "exit status -9" in err and "run `fedunlearn process` again" in err
