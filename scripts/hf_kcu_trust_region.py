"""HF-KCU's trust region against forgetting on digits-hfl (docs/methods.md, "hf-kcu"): the largest
client removed, the federation's curvature, β = 0.01 (default), 0.05, 0.1 and uncapped; the forget
and test accuracy of each step beside the source's and an exact retrain's.

    .venv/bin/python scripts/hf_kcu_trust_region.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedunlearn.config import load_params
from fedunlearn.data.datasets import load_source
from fedunlearn.data.partition import assign_dirichlet, holdout_mask
from fedunlearn.device import resolve_device
from fedunlearn.federation.fedavg import FedAvg
from fedunlearn.federation.local import Tensors, accuracy
from fedunlearn.unlearning import FederatedState, get_method, resolve_request
from models import build_model

ROOT = Path(__file__).resolve().parents[1]
BETAS = (0.01, 0.05, 0.1, None)


def digits_hfl() -> FederatedState:
    """digits-hfl as params.yaml sets it, partitioned as the DVC stage does, trained by FedAvg."""
    params, device = load_params(ROOT / "params.yaml"), resolve_device("cpu")
    scenario = params.scenario("digits-hfl")
    data = load_source(scenario.dataset)
    is_test = holdout_mask(data.sample_ids, params.seed, scenario.partition.test_fraction)
    train = data.subset(~is_test)
    owner = assign_dirichlet(train.sample_ids, train.labels, scenario.partition.num_clients,
                             scenario.partition.alpha, params.seed, data.num_classes)
    clients = [Tensors.from_arrays(train.features[owner == c], train.labels[owner == c],
                                   train.sample_ids[owner == c], device) for c in range(scenario.partition.num_clients)]
    test = Tensors.from_arrays(data.features[is_test], data.labels[is_test], data.sample_ids[is_test], device)

    def model_fn():
        return build_model(scenario.model, data.input_shape, data.num_classes)

    state = FedAvg(model_fn, scenario.train, params.seed, device).fit(clients)
    return FederatedState("hfl", model_fn, state, clients, test, scenario.train, params.seed, device, data.num_classes)


def main() -> None:
    fed = digits_hfl()
    batch = resolve_request("client", int(np.argmax([len(c) for c in fed.clients])), fed.clients)
    forget = fed.forget_data(batch)
    retrained = get_method("retrain", setting="hfl").unlearn(fed, batch).state

    def scores(state) -> str:
        model = fed.model_from(state)
        return f"forget acc {accuracy(model, forget):.3f}, test acc {accuracy(model, fed.test):.3f}"

    print(f"source: {scores(fed.state)}; exact retrain: {scores(retrained)}")
    for beta in BETAS:
        outcome = get_method("hf-kcu", hessian="federation", beta=beta).unlearn(fed, batch)
        print(f"hf-kcu, federation curvature, beta {beta}: {scores(outcome.state)}")


if __name__ == "__main__":
    main()
