"""``fedunlearn push`` (the data versions and the state snapshot to the default DVC remote) and
``fedunlearn restore`` (a workspace rebuilt from the DVC remote and the MLflow tracking server after
it was lost). What is pushed when: ``stores.durable``; docs/stores-and-recovery.md."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    push = sub.add_parser("push", help="push the data versions and the workspace's state to the default DVC remote",
                          description="`dvc push` of the data versions in dvc.lock, then a state snapshot (params, "
                                      "dvc.lock, ledger, batch records, processed requests, receipts) under "
                                      "fedunlearn-state/ on the remote. Deletion batches do this themselves before "
                                      "alias `current` moves; run it after `fedunlearn train` or once a remote is "
                                      "added.")
    push.set_defaults(handler=run_push)

    restore = sub.add_parser("restore", help="rebuild a lost workspace from the DVC remote and the MLflow server",
                             description="Into the empty directory --root: the newest state snapshot from the DVC "
                                         "remote (checked by its SHA-256), `dvc pull` of the current data versions "
                                         "(and of the data before a batch without a receipt), the ledger verified "
                                         "against the batch records, MLflow pointed at the tracking server and the "
                                         "registry checked against the receipts. The next `fedunlearn process` "
                                         "continues exactly once.")
    restore.add_argument("--dvc-remote", required=True, metavar="URL",
                         help="the DVC remote the lost workspace pushed to (a directory, s3://..., ssh://...)")
    restore.add_argument("--mlflow-tracking-uri", metavar="URI",
                         help="the MLflow tracking server (default: the one the snapshot's params.yaml names)")
    restore.set_defaults(handler=run_restore, needs_workspace=False)


def run_push(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.errors import InputError
    from fedunlearn.requests.folders import RequestFolders, batch_lock
    from stores.durable import push_state
    from stores.erasure import dvc_remote

    remote = dvc_remote(root)
    if remote is None:
        raise InputError(f"{root} has no default DVC remote: add one with `dvc remote add -d storage URL` (run in "
                         f"{root}), then run `fedunlearn push` again")
    with batch_lock(RequestFolders.create(root), rerun="fedunlearn push"):  # never half a batch
        name = push_state(root, force=True)
    print(f"pushed the data versions and the state snapshot {name} to the DVC remote {remote[0]!r} ({remote[1]})"
          if name else f"nothing to push: {root} has no data version yet (`fedunlearn prepare` or `train` first)")
    return 0


def run_restore(args: argparse.Namespace, root: Path) -> int:
    from fedunlearn.errors import InputError

    # Checked before Prefect is imported: that creates its home (<root>/.prefect) in the directory.
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InputError(f"{root} is not an empty directory: restore into a new one (`fedunlearn --root NEW restore "
                         "...`); an existing workspace is never overwritten")
    root.mkdir(parents=True, exist_ok=True)
    from stores.durable import restore

    restored = restore(root, args.dvc_remote, args.mlflow_tracking_uri)
    print("\n".join(restored.lines()))
    print(f"next: `fedunlearn --root {root} process --scenario S` continues where the lost workspace stopped")
    return 0
