"""Prefect's ephemeral API server, started as a child that dies with the CLI.

Without ``PREFECT_API_URL``, Prefect starts a temporary server (uvicorn) as a subprocess the
first time a flow runs, and stops it at exit. A SIGKILLed CLI never reaches exit: the server
lived on, re-parented to PID 1, holding a port and the workspace's Prefect database. Prefect looks
the server up as ``SubprocessASGIServer()`` (one instance per port, ``None`` for "any"), so
``install`` puts in its place an instance whose process is started through
``fedunlearn.lifeline`` — the kernel kills it when the CLI dies, however it dies. Everything else
(port choice, health wait, stop at exit) stays Prefect's. Pinned to prefect 3.8.8's
``SubprocessASGIServer`` (its command line is copied from ``_run_uvicorn_command``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

from fedunlearn import lifeline


class LifelineServer(SubprocessASGIServer):
    _instances: dict[int | None, SubprocessASGIServer] = {}  # its own: never handed out for other ports

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        command = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                   "--log-level", "error", "--lifespan", "on"]
        return subprocess.Popen(lifeline.command(command), env={
            **os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
            **get_current_settings().to_environment_variables(exclude_unset=True)})


def install() -> None:
    """Make the ephemeral server that flows of this process start (if any) a lifeline child."""
    if not isinstance(SubprocessASGIServer._instances.get(None), LifelineServer):
        SubprocessASGIServer._instances[None] = LifelineServer()
