"""Flower under the pipeline: the HFL training and the unlearning rounds run as a Flower app.

A ServerApp (``server_app``) drives the algorithms over Flower's ``Grid``: FedAvg training
(``fedavg.FedAvg``), PUF-Special and PUF-Regular (``puf``), HF-KCU with the federation's
Hessian-vector products computed on the clients (``hf_kcu``). Each SuperNode runs the ClientApp
(``client_app``), which loads its own partition of the workspace's data version and replies with
updates, gradients and Hessian-vector products, never with data.

Two ways to run it: Flower's simulation engine (``simulation.run_simulated``) and a deployment, a
SuperLink and one SuperNode process per client on 127.0.0.1 that ``deployment.run_deployed``
starts and always stops, or an existing SuperLink given by address.

The package imports the core (``fedunlearn``) and ``models``, never an orchestration package: the
layer contracts in pyproject.toml say so. The in-process engines stay the pipeline's default.
"""
