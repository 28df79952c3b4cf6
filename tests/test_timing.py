"""The flow's split into compute and orchestration: compute is the union of the intervals of
``@core_compute`` calls, so parallel client updates and nested steps count once."""

import threading
import time

from fedunlearn.timing import FlowClock, core_compute


def test_parallel_and_nested_compute_counts_once_and_the_rest_is_orchestration():
    clock = FlowClock()

    @core_compute
    def step():
        time.sleep(0.2)

    @core_compute
    def outer():
        step()

    threads = [threading.Thread(target=step) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outer()
    time.sleep(0.1)  # not compute
    split = clock.split()
    assert 0.38 <= split["core_seconds"] <= 0.5  # 0.2 s of parallel steps + 0.2 s nested, not 1.0 s
    assert 0.09 <= split["orchestration_seconds"] <= 0.2
    assert abs(split["flow_seconds"] - split["core_seconds"] - split["orchestration_seconds"]) < 0.002


def test_stages_split_the_orchestration_between_them():
    """Each stage's orchestration is its wall time since the previous stage less the compute in it;
    together they are the flow's."""
    clock = FlowClock()

    @core_compute
    def step():
        time.sleep(0.15)

    time.sleep(0.1)
    clock.stage("first")
    step()
    time.sleep(0.05)
    clock.stage("second")
    split = clock.split()
    first, second = split["orchestration_by_stage"]["first"], split["orchestration_by_stage"]["second"]
    assert 0.09 <= first <= 0.14 and 0.04 <= second <= 0.09  # the 0.15 s of compute in neither
    assert abs(first + second - split["orchestration_seconds"]) < 0.005
