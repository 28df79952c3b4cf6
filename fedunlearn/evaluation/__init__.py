"""Evaluation of unlearning (DESIGN.md §4): utility and forgetting next to the retrained model,
membership inference (population attacks and the per-example U-LiRA audit), the backdoor probe,
functional distance, and cost (PUF paper, Appendix B)."""

from fedunlearn.evaluation.backdoor import (TARGET_LABEL, TRIGGER_SIZE, apply_trigger, attack_success_rate,
                                            poison)
from fedunlearn.federation.cost import (Cost, communication_bytes, flops_per_sample, speedup,
                                        training_flops)
from fedunlearn.evaluation.metrics import evaluate_splits, functional_distance, gaps_to_reference
from fedunlearn.evaluation.mia import (AttackResult, attack_metrics, confidence_attack, label_matched_nonmembers,
                                       loss_attack, run_population_attacks, shadow_attack, ulira_audit,
                                       worst_case_auc)

__all__ = [
    "AttackResult", "Cost", "TARGET_LABEL", "TRIGGER_SIZE", "apply_trigger", "attack_metrics",
    "attack_success_rate", "communication_bytes", "confidence_attack", "evaluate_splits", "flops_per_sample",
    "functional_distance", "gaps_to_reference", "label_matched_nonmembers", "loss_attack", "poison",
    "run_population_attacks", "shadow_attack", "speedup", "training_flops", "ulira_audit", "worst_case_auc",
]
