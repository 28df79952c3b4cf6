"""The marker ``make serve`` leaves in the workspace's Prefect home while it serves the workspace: its
Prefect server's API URL and process ID (``served.json``).

`scripts/serve.sh` writes it (``fedunlearn served announce``) once its Prefect server answers and
removes it (``fedunlearn served withdraw``) as it stops. A CLI command run without
``PREFECT_API_URL`` reads it (``runtime.local_server.local_prefect_api``) and runs its flows on that
server instead of starting one of its own: its runs and artifacts then show in the served UI, and
on SQLite no second server opens the database the served one holds. A marker whose process is gone
or whose server does not answer ``/health`` — serve killed before its trap ran — is ignored.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

MARKER_NAME = "served.json"
HEALTH_TIMEOUT_S = 2.0


def marker_path(home: Path) -> Path:
    return Path(home) / MARKER_NAME


def announce(home: Path, api_url: str, pid: int) -> Path:
    """Write the marker: the served Prefect server at ``api_url``, its process ``pid``."""
    path = marker_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{MARKER_NAME}.{os.getpid()}")
    partial.write_text(json.dumps({"api_url": api_url.rstrip("/"), "pid": int(pid)}) + "\n")
    partial.replace(path)  # a reader sees the old marker or the whole new one
    return path


def withdraw(home: Path, pid: int) -> bool:
    """Remove the marker if it names the process ``pid`` (another serve's marker stays); whether it did."""
    path = marker_path(home)
    marker = read_marker(home)
    if marker is None or marker.get("pid") != int(pid):
        return False
    path.unlink(missing_ok=True)
    return True


def read_marker(home: Path) -> dict | None:
    """The marker's fields, or None when there is none or it is unreadable."""
    try:
        marker = json.loads(marker_path(home).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(marker, dict) and isinstance(marker.get("api_url"), str) and isinstance(marker.get("pid"), int)
    return marker if ok else None


def served_api(home: Path) -> str | None:
    """The API URL in the Prefect home's marker when its process runs and its server answers; None
    otherwise (no marker, or a stale one)."""
    marker = read_marker(home)
    if marker is None or not alive(marker["pid"]) or not answers(marker["api_url"]):
        return None
    return marker["api_url"]


def alive(pid: int) -> bool:
    if pid <= 0:  # 0 and -1 would signal process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def answers(api_url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether the Prefect server at ``api_url`` answers its health check."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def runs_page(api_url: str) -> str:
    """The Prefect UI's runs page of the server at ``api_url`` (its UI is served beside its API)."""
    return f"{api_url.rstrip('/').removesuffix('/api')}/runs"
