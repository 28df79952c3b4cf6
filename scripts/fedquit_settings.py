"""fedquit's settings tried on one draw without retraining (issue: forgetting at one round's cost):
each (options) applied to the original, then evaluated, audited and gated as a deletion batch does
(the interim tier, no retrained reference), its FLOPs against an exact retrain's counted by hand
(F · the retained samples · rounds · local epochs: what the registered retrain would spend). For
choosing settings on draws other than those reported (``scripts/frontier.py`` then measures the
chosen ones against real retrains on fresh draws).

    .venv/bin/python scripts/fedquit_settings.py --root /tmp/fr --scenario mnist5k-canary-hfl --kind canaries40 \\
        --seed 900 --grid '[{}, {"rounds": 1, "participants": "holders", "local_steps": 10, "recovery_rounds": 0}]'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from audit_power import build_setup  # noqa: E402
from frontier import draw_forget_set, part_accuracies  # noqa: E402

from fedunlearn.certify.certificate import EMPIRICAL_ONLY  # noqa: E402
from fedunlearn.certify.gates import PromotionGates, judge  # noqa: E402
from fedunlearn.config import load_params  # noqa: E402
from fedunlearn.device import resolve_device  # noqa: E402
from fedunlearn.evaluation.audit import audit_forgetting  # noqa: E402
from fedunlearn.evaluation.evaluator import Evaluator, evaluation_sets  # noqa: E402
from fedunlearn.unlearning.registry import get_method  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/fr"))
    parser.add_argument("--scenario", default="mnist5k-canary-hfl")
    parser.add_argument("--kind", default="canaries40")
    parser.add_argument("--seed", type=int, default=900)
    parser.add_argument("--grid", type=json.loads, default=[{}], metavar="JSON", help="a list of fedquit options")
    args = parser.parse_args()
    torch.set_num_threads(1)
    params = load_params(args.root / "params.yaml")
    setup = build_setup(argparse.Namespace(scenario=args.scenario, rounds=None), params, args.root,
                        resolve_device("cpu"))
    federation = setup.federation
    batch = draw_forget_set(args.kind, args.seed, setup)
    sets = evaluation_sets(federation, batch)
    evaluator = Evaluator(federation, batch, sets=sets, shadow_model=setup.shadow)
    source = federation.model_from(setup.original.state)
    source_eval = evaluator.evaluate(source)
    source_audit = audit_forgetting(source, sets.forget, setup.references, seed=params.seed)
    batch = batch.with_remembered(source_audit.removal_targets())
    config = federation.train_config
    retained = sum(len(c) for c in federation.clients) - batch.num_forget
    retrain_flops = federation.flops_per_sample() * retained * config.rounds * config.local_epochs
    print(f"draw {args.seed} ({args.kind}): source test {source_eval.test_acc:.4f}, "
          f"{len(batch.remembered)} remembered", flush=True)
    for options in args.grid:
        options = {"target_test_acc": source_eval.test_acc, **options}
        started = time.perf_counter()
        outcome = get_method("fedquit", setting="hfl", kind="sample", **options).unlearn(
            dataclasses.replace(federation, state=setup.original.state), batch)
        seconds = time.perf_counter() - started
        model = federation.model_from(outcome.state)
        evaluation = evaluator.evaluate(model)
        audit = audit_forgetting(model, sets.forget, setup.references, seed=params.seed)
        per_sample = audit.per_sample_check(source_audit)
        gate = judge(evaluation, EMPIRICAL_ONLY, source=source_eval, reference=None, gates=PromotionGates(),
                     audit=audit.as_check(), source_audit=source_audit.as_check(),
                     audit_equivalence=audit.equivalence_check(), atypical=audit.atypical, per_sample=per_sample)
        shown = {k: v for k, v in options.items() if k != "target_test_acc"}
        print(json.dumps({"options": shown, "test_acc_minus_source": round(evaluation.test_acc - source_eval.test_acc, 4),
                          "audit_auc": round(audit.auc, 3), "per_sample": per_sample.verdict,
                          "serves_interim": gate.interim, "retrain_over_flops": round(retrain_flops / outcome.cost.flops, 1),
                          "seconds": round(seconds, 1), "holders": len(outcome.notes.get("target_clients", [])),
                          **part_accuracies(model, sets.forget, setup.canaries)}), flush=True)


if __name__ == "__main__":
    main()
