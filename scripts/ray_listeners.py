"""Which addresses Ray's processes listen on, as Flower's simulation engine starts Ray (issue 38 item 5).

Flower's Ray backend calls ``ray.init(runtime_env=..., **backend_config["init_args"])``; this script
does the same with the init arguments ``fedunlearn_flower.simulation`` passes, once per variant
(``--variant``: the init arguments or environment variables tried), runs one task so a worker
starts, and prints every LISTEN socket of Ray's processes (the driver's descendants, and the driver
itself) with the process and the role Ray gives that port.

    .venv/bin/python scripts/ray_listeners.py --variant default
    .venv/bin/python scripts/ray_listeners.py --variant loopback   # _node_ip_address, dashboard_host
    .venv/bin/python scripts/ray_listeners.py --variant env        # RAY_NODE_IP_ADDRESS & co. set too
    .venv/bin/python scripts/ray_listeners.py --variant single-machine  # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

Each variant runs in a fresh process (Ray reads its environment once): call it once per variant.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import time

import psutil

VARIANTS = {
    "default": ({}, {}),
    "loopback": ({"_node_ip_address": "127.0.0.1", "dashboard_host": "127.0.0.1"}, {}),
    "env": ({"_node_ip_address": "127.0.0.1", "dashboard_host": "127.0.0.1"},
            {"RAY_NODE_IP_ADDRESS": "127.0.0.1", "RAY_OVERRIDE_NODE_IP_ADDRESS": "127.0.0.1",
             "RAY_DASHBOARD_HOST": "127.0.0.1"}),
    # Ray's single-machine mode (its default on macOS and Windows): the node's address is the loopback.
    "single-machine": ({}, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}),
}


def port_roles() -> dict[int, str]:
    """The ports Ray's node reports, by role (what ``ray.init`` knows of its own servers)."""
    import ray

    node = ray._private.worker._global_node
    roles = {"GCS": node.gcs_address.rsplit(":", 1)[1], "raylet (node manager)": node.node_manager_port,
             "metrics export": node.metrics_export_port, "metrics agent (gRPC)": node.metrics_agent_port,
             "runtime-env agent": node.runtime_env_agent_port,
             "dashboard agent (gRPC)": node.dashboard_agent_listen_port}
    info = next(n for n in ray.nodes() if n["NodeManagerPort"] == node.node_manager_port)
    roles["object manager"] = info.get("ObjectManagerPort")
    return {int(port): role for role, port in roles.items() if port}


def listeners() -> list[tuple[str, int, str, int]]:
    """(process name, pid, address, port) of each LISTEN socket of this process and its descendants."""
    found = []
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            name = " ".join(proc.cmdline()[:2])[-70:]
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((name, proc.pid, conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    return sorted(found, key=lambda row: (row[2], row[0]))


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback (``::ffff:127.0.0.1``: a dual-stack socket bound to it)."""
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    args = parser.parse_args()
    init_args, env = VARIANTS[args.variant]
    os.environ.update(env)
    import ray

    ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}}, num_cpus=1,
             include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, **init_args)
    ray.get(ray.remote(lambda: os.getpid()).remote())  # a worker, as a ClientApp's actor would start
    time.sleep(3.0)  # agents open their ports shortly after init returns
    roles = port_roles()
    rows = listeners()
    ray.shutdown()
    print(f"variant {args.variant}: init args {init_args}, environment {env}")
    print(f"{'address':<16} {'port':>6}  {'role':<24} process")
    for name, pid, address, port in rows:
        print(f"{address:<16} {port:>6}  {roles.get(port, '?'):<24} {name} (pid {pid})")
    exposed = [row for row in rows if not is_loopback(row[2])]
    print(f"{len(exposed)} of {len(rows)} listening sockets on a non-loopback address")


if __name__ == "__main__":
    main()
