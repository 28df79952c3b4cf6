"""Which Prefect server a CLI command runs its flows on (``runtime.local_server.local_prefect_api``):
the served one while `make serve` serves the workspace (its marker, ``runtime.served``, names a live
process and a server that answers), one of its own when the marker is stale, and the user's
``PREFECT_API_URL`` over both. A stand-in answers ``/health``: no Prefect server is started."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

from runtime import local_server, served


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802  (http.server's name)
        self.send_response(200 if self.path == "/api/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def answering_server():
    """A stand-in for the served Prefect server: its API URL; it answers /api/health."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def home(tmp_path) -> Path:
    """The workspace's Prefect home, with no API URL set (the session's test server unset)."""
    with temporary_settings(updates={PREFECT_HOME: str(tmp_path / ".prefect")}, restore_defaults={PREFECT_API_URL}):
        yield tmp_path / ".prefect"


@pytest.fixture
def own_server(monkeypatch) -> list[Path]:
    """``local_prefect_api``'s own server replaced by a stand-in: the homes it was started on."""
    started = []

    @contextlib.contextmanager
    def stand_in(home, timeout_s, own=False, on_exit=None):
        started.append(home)
        yield "http://127.0.0.1:1/api"

    monkeypatch.setattr(local_server, "prefect_server", stand_in)
    return started


def gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_marker_is_written_and_removed_only_for_its_own_process(tmp_path):
    path = served.announce(tmp_path, "http://127.0.0.1:4200/api/", pid=4321)
    assert json.loads(path.read_text()) == {"api_url": "http://127.0.0.1:4200/api", "pid": 4321}
    assert not served.withdraw(tmp_path, pid=1234) and path.is_file()  # another serve's marker stays
    assert served.withdraw(tmp_path, pid=4321) and not path.exists()
    assert not served.withdraw(tmp_path, pid=4321)  # nothing left to remove


def test_a_marker_is_used_only_while_its_process_runs_and_its_server_answers(tmp_path, answering_server):
    served.announce(tmp_path, answering_server, pid=os.getpid())
    assert served.served_api(tmp_path) == answering_server
    served.announce(tmp_path, answering_server, pid=gone_pid())
    assert served.served_api(tmp_path) is None  # serve was killed: its process is gone
    served.announce(tmp_path, "http://127.0.0.1:1/api", pid=os.getpid())
    assert served.served_api(tmp_path) is None  # a server that does not answer
    served.marker_path(tmp_path).write_text("{not json")
    assert served.served_api(tmp_path) is None
    assert served.runs_page("http://127.0.0.1:4200/api") == "http://127.0.0.1:4200/runs"


def test_a_command_runs_on_the_served_server_and_says_where_its_runs_show(home, answering_server, own_server,
                                                                          capsys):
    served.announce(home, answering_server, pid=os.getpid())
    with local_server.local_prefect_api() as api:
        assert api == answering_server and PREFECT_API_URL.value() == answering_server
    assert own_server == []
    runs = answering_server.removesuffix("/api") + "/runs"
    assert capsys.readouterr().err.splitlines() == [
        f"runs show in the Prefect UI: {runs} (the server `make serve` runs for this workspace)"]


def test_a_stale_marker_leaves_the_command_its_own_server(home, own_server, capsys):
    served.announce(home, "http://127.0.0.1:1/api", pid=gone_pid())
    with local_server.local_prefect_api() as api:
        assert api == "http://127.0.0.1:1/api" and own_server == [home]
    assert capsys.readouterr().err == ""


def test_the_users_prefect_api_url_wins_over_the_marker(home, answering_server, own_server):
    served.announce(home, answering_server, pid=os.getpid())
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with local_server.local_prefect_api() as api:
            assert api is None and PREFECT_API_URL.value() == "http://127.0.0.1:9/api"
    assert own_server == []


def test_serve_writes_and_removes_the_marker_through_the_cli(workspace, tmp_path, monkeypatch):
    from cli import main

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    assert main(["--root", str(workspace), "served", "announce", "--api-url", "http://127.0.0.1:4200/api",
                 "--pid", "4321"]) == 0
    assert served.read_marker(tmp_path / "home") == {"api_url": "http://127.0.0.1:4200/api", "pid": 4321}
    assert main(["--root", str(workspace), "served", "withdraw", "--pid", "4321"]) == 0
    assert not served.marker_path(tmp_path / "home").exists()


def test_status_reads_the_served_server_and_never_starts_one(home, answering_server, own_server):
    with local_server.served_prefect_api() as unserved:
        assert unserved is None and PREFECT_API_URL.value() in (None, "")
    served.announce(home, answering_server, pid=os.getpid())

    with local_server.served_prefect_api() as api:
        assert api == answering_server and PREFECT_API_URL.value() == answering_server

    assert own_server == []  # a reading command starts no server of its own, served or not
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with local_server.served_prefect_api() as api:
            assert api is None and PREFECT_API_URL.value() == "http://127.0.0.1:9/api"  # the user's setting wins
