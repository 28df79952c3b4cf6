"""The interim audit's operating characteristic: how often ``judge_within`` (the margin sized by
``equivalence_margin``) passes a forget set whose true stratified AUC against never-seen samples is
a given value, at the audit's shape for 40 canaries (10 strata, 4 forget samples and 27 non-members
each). Scores are normal; members are shifted by d = √2 · Φ⁻¹(AUC) so the true AUC is exact.

    .venv/bin/python scripts/equivalence_oc.py --draws 400
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats

from fedunlearn.evaluation.uncertainty import (PASS, STRATIFIED_AUC_METHOD, equivalence_margin, judge_within,
                                               stratified_auc, stratified_auc_interval, stratified_null_sd)


def pass_rate(true_auc: float, draws: int, rng: np.random.Generator, strata: int, members: int,
              nonmembers: int) -> float:
    shift = np.sqrt(2) * stats.norm.ppf(true_auc)
    member_strata, nonmember_strata = np.repeat(np.arange(strata), members), np.repeat(np.arange(strata), nonmembers)
    margin = equivalence_margin(stratified_null_sd(member_strata, nonmember_strata))
    passed = 0
    for _ in range(draws):
        args = (rng.normal(shift, 1, member_strata.size), member_strata, rng.normal(0, 1, nonmember_strata.size),
                nonmember_strata)
        check = judge_within("eq", stratified_auc(*args), lambda level: stratified_auc_interval(*args, confidence=level),
                             margin, n=member_strata.size + nonmember_strata.size, method=STRATIFIED_AUC_METHOD)
        passed += check.verdict == PASS
    return passed / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400)
    parser.add_argument("--members", type=int, default=4, help="forget samples per stratum")
    parser.add_argument("--nonmembers", type=int, default=27, help="non-members per stratum")
    parser.add_argument("--strata", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    member_strata = np.repeat(np.arange(args.strata), args.members)
    margin = equivalence_margin(stratified_null_sd(member_strata, np.repeat(np.arange(args.strata), args.nonmembers)))
    print(f"margin {margin:.3f} ({args.strata} strata × {args.members} forget samples, {args.nonmembers} non-members "
          f"each; {args.draws} draws per row)\n\n| true AUC | passes |\n|---|---|")
    edges = (round(0.5 - margin, 3), round(0.5 + margin, 3))    # where either side may pass at most α
    for true_auc in sorted({0.2, 0.3, 0.35, 0.4, 0.5, 0.6, 0.65, 0.7, 0.8, *[e for e in edges if 0 < e < 1]}):
        print(f"| {true_auc:.2f} | {pass_rate(true_auc, args.draws, rng, args.strata, args.members, args.nonmembers):.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
