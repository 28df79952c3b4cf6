"""Does an exact retrain of a sharded scenario train what its original training trained, less the
deleted data? For a workspace after `train`, `request client ...` and `process --method retrain`:

* the original federation (``OLD_DATA_VERSION``, from DVC's cache) trained from scratch, and the
  current data version trained from scratch, each shard's model compared bit for bit;
* the ``retrain`` method run on the original by shard (what ``process --method retrain`` runs) for
  client 0's request, compared with the training from scratch on the current data;
* each registered VERSION's ``test_acc`` beside the accuracy of the model ``mlflow.pytorch.load_model``
  returns for it, and whether its weights are the current data's training from scratch (a retired
  version has no weights left to load).

    .venv/bin/python scripts/shards_retrain_paths.py --root /tmp/shw1 --scenario digits-hfl \\
        --old-data-version f5b577e46a490a816066dcda7fcc6e2a --versions 1 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def scored(federation) -> str:
    from fedunlearn.federation.local import accuracy

    shards = [accuracy(federation.shard(k).model_from(federation.shard(k).state), federation.test)
              for k in range(federation.count)]
    return (f"ensemble {accuracy(federation.model_from(federation.state), federation.test):.4f}, "
            f"shards alone {', '.join(f'{a:.4f}' for a in shards)}")


def loaded(root: Path, scenario: str, version: str, test) -> tuple[float, dict]:
    import mlflow
    import mlflow.pytorch

    from stores.registry import tracking_uri

    mlflow.set_tracking_uri(tracking_uri(root))
    mlflow.set_registry_uri(tracking_uri(root))
    served = mlflow.pytorch.load_model(f"models:/{scenario}/{version}")
    with torch.no_grad():
        return (served(test.x).argmax(1) == test.y).float().mean().item(), served.state_dict()


def main() -> None:
    from fedunlearn.federation.forget_set import ForgetSet
    from fedunlearn.training import train, trained
    from fedunlearn.unlearning import get_method
    from stores.workspace import Workspace
    from tasks.data import read_federation

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--old-data-version", required=True, help="the data version the original trained on")
    parser.add_argument("--client", type=int, default=0, help="the client the request removed")
    parser.add_argument("--versions", nargs="*", default=[])
    args = parser.parse_args()
    ws, cpu = Workspace.open(args.root), torch.device("cpu")
    old = read_federation(ws, args.scenario, cpu, args.old_data_version)
    new = read_federation(ws, args.scenario, cpu)
    print(f"clients' samples: original {[len(c) for c in old.clients]}, now {[len(c) for c in new.clients]}; "
          f"shard of each client {old.shard_of}")
    original, scratch = trained(old, train(old)), trained(new, train(new))
    print(f"original, trained from scratch: {scored(original)}")
    print(f"current data, trained from scratch: {scored(scratch)}")
    batch = ForgetSet("client", {args.client: old.clients[args.client].sample_ids}, clients=[args.client])
    by_shard = original.shard_states(get_method("retrain", setting="hfl").unlearn(original, batch).state)
    for k, (before, fresh) in enumerate(zip(original.shard_states(), scratch.shard_states())):
        print(f"shard {k}: original == from scratch now {same(before, fresh)}; "
              f"retrain method == from scratch now {same(by_shard[k], fresh)}")
    for version in args.versions:
        found = ws.registry.version(args.scenario, version)
        registered = ws.registry.metrics(found.run_id).get("test_acc")
        try:
            acc, state = loaded(ws.root, args.scenario, version, new.test)
            print(f"v{version}: registered test_acc {registered:.4f}, loaded model {acc:.4f}; its weights == "
                  f"the current data trained from scratch {same(state, scratch.state)}")
        except (OSError, RuntimeError) as error:  # a retired version's weights are gone
            print(f"v{version}: registered test_acc {registered:.4f}, not loadable ({type(error).__name__})")


if __name__ == "__main__":
    main()
