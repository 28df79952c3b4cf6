"""Flower's simulation engine: the ServerApp in a thread of this process, one virtual SuperNode
per client, their ClientApps in Ray actors.

Flower gives each ClientApp 2 CPUs by default, which on a 2-core machine runs one client at a
time; ``cpus_per_client`` (1 by default) lets as many run at once as there are cores.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from flwr.simulation import run_simulation

from fedunlearn_flower import client_app
from fedunlearn_flower.errors import FlowerRunFailed
from fedunlearn_flower.partition import Scenario
from fedunlearn_flower.results import FlowerResult, read_result
from fedunlearn_flower.server_app import STATUS, Job, server_app


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
