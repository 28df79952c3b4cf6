"""Scale-out: client updates on a Dask cluster (prefect-dask, a LocalCluster here) give the same
model as the default thread runner for a fixed seed."""

import pytest
import torch

from stores.registry import Registry


@pytest.mark.reliability  # slow end to end: `make reliability`
def test_dask_runner_trains_the_same_model_as_the_thread_runner(workspace, prefect_server):
    from prefect_dask import DaskTaskRunner

    from flows.task_runners import make_task_runner
    from flows.train import train_federated

    threads = train_federated.with_options(task_runner=make_task_runner("thread"))(
        scenario="digits-hfl", root=str(workspace))
    thread_state = Registry(workspace).load("digits-hfl", alias="original").state
    dask_runner = DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": 1, "processes": True})
    dask = train_federated.with_options(task_runner=dask_runner)(scenario="digits-hfl", root=str(workspace))
    dask_state = Registry(workspace).load("digits-hfl", alias="original").state
    assert dask.model_version != threads.model_version
    assert dask.test_acc == threads.test_acc
    assert all(torch.equal(thread_state[k], dask_state[k]) for k in thread_state)
