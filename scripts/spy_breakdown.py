"""Attribute a ``py-spy record --subprocesses -f raw`` profile of ``fedunlearn process`` to the
flow's steps: on-CPU seconds per process, and for the main process per task of the
process-deletions flow (the first matching frame wins), imports and the rest.

    py-spy record --subprocesses -r 50 -f raw -o batch.spy -- fedunlearn process --scenario mnist5k-hfl
    .venv/bin/python scripts/spy_breakdown.py batch.spy --rate 50
"""

from __future__ import annotations

import argparse
import collections

STEPS = ("load_data_version", "prepare_batch", "finish_batch", "collect_inbox", "validate_requests", "open_batch",
         "build_evaluator", "unlearn (tasks/benchmark", "evaluate (tasks/benchmark", "register_version",
         "move_alias", "write_receipt", "apply_gates", "load_source_model", "find_reference", "unlearning_backlog",
         "recover_interrupted_batches", "registered_for_batch")


def step_of(frames: list[str]) -> str:
    stack = ";".join(frames)
    for step in STEPS:
        if step in stack:
            return step.split(" (")[0]
    if "process_deletions (flows/process.py" in stack:
        return "flow body, other"
    if "_find_and_load" in stack:
        return "imports"
    return "other (CLI, Prefect engine, threads)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--rate", type=int, default=50, help="py-spy's sampling rate (-r)")
    args = parser.parse_args()
    processes, steps = collections.Counter(), collections.Counter()
    with open(args.profile) as lines:
        for line in lines:
            stack, count = line.rstrip().rsplit(" ", 1)
            frames = stack.split(";")
            marks = [i for i, frame in enumerate(frames) if frame.startswith("process ")]
            processes[frames[marks[-1]][:110]] += int(count)
            if len(marks) == 1:  # the main process, not one of its children
                steps[step_of(frames[marks[0] + 1:])] += int(count)
    print("on-CPU seconds per process:")
    for name, count in processes.most_common():
        print(f"{count / args.rate:7.1f}  {name}")
    print("\nmain process, per step:")
    for name, count in steps.most_common():
        print(f"{count / args.rate:7.1f}  {name}")


if __name__ == "__main__":
    main()
