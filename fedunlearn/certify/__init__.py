"""Certificates (guarantee class + the numbers behind it) and promotion gates."""

from fedunlearn.certify.certificate import (BOUNDED_APPROXIMATION, CONSTRAINT_SATISFIED, EMPIRICAL_ONLY,
                                            EXACT_RETRAIN, FORMAL, GUARANTEES, NOT_CERTIFIED, Certificate,
                                            GateResult, Gates, certificate_for, evaluate_gates)

__all__ = ["BOUNDED_APPROXIMATION", "CONSTRAINT_SATISFIED", "EMPIRICAL_ONLY", "EXACT_RETRAIN", "FORMAL",
           "GUARANTEES", "NOT_CERTIFIED", "Certificate", "GateResult", "Gates", "certificate_for",
           "evaluate_gates"]
