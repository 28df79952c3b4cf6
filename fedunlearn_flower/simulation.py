"""Flower's simulation engine: the ServerApp in a thread of this process, one virtual SuperNode
per client, their ClientApps in Ray actors.

Flower gives each ClientApp 2 CPUs by default, which on a 2-core machine runs one client at a
time; ``cpus_per_client`` (1 by default) lets as many run at once as there are cores.

Ray binds its servers (GCS, raylet, object manager, workers, agents, the autoscaler's metrics) to
the node's address, which on Linux is the machine's outward address: every one of them would
listen beyond this machine. A simulation needs no other node, so it runs Ray in its single-machine
mode (its default on macOS and Windows), whose node address is the loopback: all of them bind
127.0.0.1 (``scripts/ray_listeners.py`` shows each variant; ``ray.init(_node_ip_address=
"127.0.0.1")`` alone does not do it, Ray replaces a loopback address by the outward one).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from flwr.simulation import run_simulation

from fedunlearn_flower import client_app
from fedunlearn_flower.errors import FlowerRunFailed
from fedunlearn_flower.partition import Scenario
from fedunlearn_flower.results import FlowerResult, read_result
from fedunlearn_flower.server_app import STATUS, Job, server_app


# Ray's switch for its single-machine mode, read when Ray is imported (by the driver and every process it starts).
SINGLE_MACHINE_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def ray_on_loopback() -> Iterator[None]:
    """Ray in single-machine mode for the block (module docstring), this process's environment
    restored afterwards. Ray reads the switch once, as it is imported — in the block, as Flower's Ray
    backend imports it when the simulation starts; a process that imported Ray before with the
    outward address keeps it, and is told so."""
    before = os.environ.get(SINGLE_MACHINE_VARIABLE)
    os.environ[SINGLE_MACHINE_VARIABLE] = "0"
    if "ray" in sys.modules:
        from ray.util import get_node_ip_address

        if not ipaddress.ip_address(get_node_ip_address()).is_loopback:
            logging.getLogger(__name__).warning(
                "Ray was imported in this process before the simulation, with node address %s: its servers "
                "will listen beyond this machine; run the simulation in a process of its own",
                get_node_ip_address())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SINGLE_MACHINE_VARIABLE, None)
        else:
            os.environ[SINGLE_MACHINE_VARIABLE] = before


def run_simulated(job: Job, *, cpus_per_client: float = 1.0, total_cpus: int | None = None) -> FlowerResult:
    """Run ``job`` on Flower's simulation engine (Ray); its models, or its error as a fedunlearn error."""
    clients = Scenario.load(job.root, job.scenario).num_clients
    job.write()
    start = time.perf_counter()
    # Flower's Ray backend appends this process's sys.path to PYTHONPATH for its actors and leaves
    # it there: restored afterwards, so later subprocesses of the caller start as before.
    pythonpath = os.environ.get("PYTHONPATH")
    backend = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": 0.0},
               "init_args": {"num_cpus": total_cpus or os.cpu_count() or 1, "include_dashboard": False,
                             "logging_level": logging.WARNING, "log_to_driver": False}}
    try:
        with ray_on_loopback():
            run_simulation(server_app=server_app(job), client_app=client_app.app, num_supernodes=clients,
                           backend_config=backend)
    except Exception as err:
        # The ServerApp's own errors are in status.json and raised from there, typed; anything
        # else (the engine failed before or around it) is raised here.
        if not (Path(job.out_dir) / STATUS).is_file():
            raise FlowerRunFailed(f"Flower's simulation engine failed for {job.scenario}: {err}") from err
    finally:
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath
    return read_result(job, time.perf_counter() - start)
