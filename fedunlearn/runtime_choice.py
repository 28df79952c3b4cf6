"""Which engine computes a command's training and unlearning : the decisions, as plain
functions, that ``fedunlearn train|process --runner`` and the flows' ``runner`` parameter make.

The engine is our own in-process loop unless the command or the scenario's params (``runner:``)
names Flower. ``fedunlearn train --runner`` also keeps its older meaning, the Prefect task runner
of the in-process engine (``thread``, ``dask``, ``ray``): one flag, two kinds of value, told apart
here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from fedunlearn.config import Runtime
from fedunlearn.errors import InputError

if TYPE_CHECKING:  # annotations only: the CLI's parser reads this module, and the methods import torch
    from fedunlearn.unlearning.escalation import Attempt

TASK_RUNNERS = ("thread", "dask", "ray")
ENGINE_RUNNERS = tuple(r.value for r in Runtime)
# The version tag ``runtime`` of a model our own loop computed (Flower's engine names its own).
IN_PROCESS_RUNTIME = "in-process"
# The engine of ``fedunlearn_flower.engine`` each Flower runner means.
FLOWER_ENGINES = {Runtime.flower: "deployment", Runtime.flower_simulation: "simulation"}


def split_train_runner(value: str | None) -> tuple[str, Runtime | None]:
    """``fedunlearn train --runner``'s value as (Prefect task runner, engine): a task runner leaves
    the engine to the scenario (None) — it only spreads the in-process engine's client updates."""
    if value is None or value in TASK_RUNNERS:
        return value or "thread", None
    return "thread", Runtime(value)


def choose_runtime(requested: Runtime | str | None, scenario_runner: Runtime | str | None) -> Runtime:
    """The command's choice, else the scenario's ``runner:``, else in-process."""
    return Runtime(requested or scenario_runner or Runtime.in_process)


def training_runtime(requested: Runtime | str | None, scenario_runner: Runtime | str | None, role: str) -> Runtime:
    """The engine a training uses: an original follows ``choose_runtime``; a retrained reference (the
    exact retrain that ends an escalation, the gates' reference) stays in-process unless asked for,
    as the unlearning's exactness does not depend on the engine that retrains."""
    return choose_runtime(requested, scenario_runner if role == "original" else None)


def runtime_tag(runner: Runtime) -> str:
    """The version tag ``runtime`` of a model ``runner`` computed."""
    engine = flower_engine(runner)
    return IN_PROCESS_RUNTIME if engine is None else f"flower-{engine}"


def flower_engine(runner: Runtime) -> str | None:
    """``deployment`` or ``simulation`` for a Flower runner; None for the in-process engine."""
    return FLOWER_ENGINES.get(Runtime(runner))


def check_flower_training(runner: Runtime, scenario: str, setting: str, *, backdoor: bool = False,
                          local_epochs: int | None = None) -> None:
    """Refuse, before anything runs, what the Flower app cannot do: a scenario other than HFL, the
    backdoor trigger (the clients read their partitions from disk, untriggered), a local-epochs
    override (the ClientApps read the scenario's own from params.yaml)."""
    if flower_engine(runner) is None:
        return
    why = (f"scenario {scenario} is {setting}; the Flower app runs HFL scenarios only" if setting != "hfl"
           else "--backdoor puts the trigger on the data in this process; Flower's clients read their own "
                "partitions" if backdoor
           else "--local-epochs is not passed to Flower's clients: set train.local_epochs in params.yaml"
           if local_epochs is not None else None)
    if why:
        raise InputError(f"--runner {Runtime(runner).value}: {why}; use --runner in-process")


def flower_attempts(runner: Runtime, attempts: Sequence[Attempt], supported: Mapping[str, set[str]],
                    chosen_by_user: bool) -> list[Attempt]:
    """The batch's attempts on a Flower runner. A method the user chose that Flower's app lacks, or
    an option it does not take, is an error (before the ledger moves); a method the default
    escalation adds as a fallback is kept where Flower lacks it, to run in-process
    (``in_process_fallbacks`` says which, and the batch warns), as the exact retrain that ends the
    chain does. ``supported``: method → the options its Flower version accepts."""
    if flower_engine(runner) is None:
        return list(attempts)
    for number, attempt in enumerate(attempts):
        if attempt.exact:
            continue
        if attempt.method not in supported:
            if chosen_by_user or number == 0:
                raise InputError(f"method {attempt.method!r} has no Flower version (runner "
                                 f"{Runtime(runner).value}); choose one of {', '.join(sorted(supported))}, or "
                                 "--runner in-process")
            continue
        unknown = sorted(set(attempt.options) - supported[attempt.method])
        if unknown:
            raise InputError(f"method {attempt.method!r} on runner {Runtime(runner).value} takes no option(s) "
                             f"{', '.join(unknown)}; its Flower version takes {', '.join(sorted(supported[attempt.method]))}")
    return list(attempts)


def in_process_fallbacks(runner: Runtime, attempts: Sequence[Attempt], supported: Mapping[str, set[str]]) -> str | None:
    """The warning a batch on a Flower runner logs and prints when fallbacks of its escalation have
    no Flower version and run in-process instead: which methods, on which runner; None when every
    attempt but the exact retrain runs on Flower. Said aloud because the user asked for Flower, and
    these attempts read the clients' data in this process."""
    if flower_engine(runner) is None:
        return None
    methods = list(dict.fromkeys(a.method for a in attempts if not a.exact and a.method not in supported))
    if not methods:
        return None
    return (f"runner {Runtime(runner).value}: the escalation's fallback(s) {', '.join(methods)} have no Flower "
            "version and run in-process (our loop, on this machine's copy of the clients' data) if the batch "
            "reaches them, as the exact retrain does")
