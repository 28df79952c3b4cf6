"""Served flow runs that start warm: forked from a process that has imported the application once.

Prefect 3.8's runner (``serve``) starts each flow run of an in-memory deployment with
``prefect.flow_engine.run_flow_in_subprocess``: a *spawned* interpreter that imports torch, Prefect,
MLflow and the flows (≈ 4 s before the flow begins), then pays for Great Expectations and MLflow's
first model save inside the flow (≈ 3.5 s of a deletion batch). Here those runs come from a
multiprocessing *forkserver* instead: a clean interpreter, started once, that runs
``flows.warm_start`` and forks a copy of itself for every run. Prefect chose spawn because a flow
engine forked from the runner (event loops, client threads) deadlocks; the forkserver holds no such
threads — it never runs Prefect, only imports it.

What the runner does with the process (its handle, cancellation, exit code) is unchanged: only the
start method differs, through the one ``multiprocessing.get_context`` call of
``run_flow_in_subprocess`` (the pinned Prefect's; ``tests/test_warm_runs.py`` fails if that moves).

Each run also builds one verified TLS context per CA file (``share_tls_contexts``) where Prefect built
one for every API client it opened (≈ 20 ms of reading the CA bundle each, 0.34 s of a deletion batch
on 2 cores, even against ``http://127.0.0.1``).

A served flow travels to its run's process by reference — module and name, as
``python -m prefect.engine`` loads an entrypoint — rather than by value, as cloudpickle would send it
(the module's attribute is the ``Flow``, not its function): by value, its function keeps only the
globals its body names, so string annotations (``MethodChoice``) no longer resolve and module state is
copied. In a warm run the module is already imported; in a cold one the child imports it.
"""

from __future__ import annotations

import copyreg
import importlib
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import ssl
import sys
import threading
from typing import Any

from prefect import Flow

WARM_START = "flows.warm_start"


class _ForkServerProcesses:
    """Stands for the ``multiprocessing`` module inside ``prefect.flow_engine``: every context it
    asks for is the forkserver's."""

    def __init__(self, context: multiprocessing.context.BaseContext):
        self._context = context

    def get_context(self, method: str | None = None) -> multiprocessing.context.BaseContext:
        return self._context

    def __getattr__(self, name: str) -> Any:
        return getattr(multiprocessing, name)


class _VerifiedContexts:
    """Stands for the ``ssl`` module inside Prefect's client modules: a verified context for a CA
    file (``create_default_context(cafile=...)``, which Prefect never changes after) is built once and
    shared by every client of the process — a context is made to be shared by connections and
    threads. Any other call — the unverified context Prefect builds and then changes when TLS checks
    are off — gets a fresh context, as before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verified: dict[str, ssl.SSLContext] = {}

    def create_default_context(self, purpose: ssl.Purpose = ssl.Purpose.SERVER_AUTH, *, cafile: str | None = None,
                               capath: str | None = None, cadata: Any = None) -> ssl.SSLContext:
        if cafile is None or capath is not None or cadata is not None or purpose != ssl.Purpose.SERVER_AUTH:
            return ssl.create_default_context(purpose, cafile=cafile, capath=capath, cadata=cadata)
        with self._lock:
            if cafile not in self._verified:
                self._verified[cafile] = ssl.create_default_context(cafile=cafile)
            return self._verified[cafile]

    def __getattr__(self, name: str) -> Any:
        return getattr(ssl, name)


# Prefect's modules that build a verified context for each API client (HTTP, and the version check).
PREFECT_TLS_MODULES = ("prefect.client.orchestration", "prefect._internal.version_checking")


def share_tls_contexts() -> None:
    """From now on, Prefect's API clients in this process share one verified TLS context per CA file
    (module docstring). Each process fills its own: one forked from the warm process builds it at its
    first client."""
    for name in PREFECT_TLS_MODULES:
        module = importlib.import_module(name)
        if not isinstance(module.ssl, _VerifiedContexts):
            module.ssl = _VerifiedContexts()


def started_warm() -> bool:
    """Whether this process is a flow run forked from the warm process (it holds what that process
    imported, ``flows.warm_start`` first of all)."""
    return WARM_START in sys.modules


def start_warm_runs() -> multiprocessing.context.BaseContext:
    """From now on, flow runs this process serves are forked from the warm process, which starts
    here (its ≈ 7 s of imports overlap the deployments' registration, so the first run is warm too)."""
    from prefect import flow_engine

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([WARM_START])
    multiprocessing.forkserver.ensure_running()
    flow_engine.multiprocessing = _ForkServerProcesses(context)
    return context


def _module_flow(module: str, name: str) -> Flow:
    return getattr(importlib.import_module(module), name)


def _reduce_flow(served: Flow) -> tuple:
    module, name = served.fn.__module__, served.fn.__name__
    if getattr(importlib.import_module(module), name, None) is served:
        return _module_flow, (module, name)
    return served.__reduce_ex__(4)  # a flow made at run time (tests): by value, as before


def send_flows_by_reference() -> None:
    """Pickle every module-level flow of this process as its module and name."""
    copyreg.pickle(Flow, _reduce_flow)
