"""Certificates (guarantee class + the numbers behind it), the residual budget, and the gates."""

from fedunlearn.certify.certificate import (BOUNDED_APPROXIMATION, CONSTRAINT_SATISFIED, EMPIRICAL_ONLY,
                                            EXACT_RETRAIN, FORMAL, GUARANTEES, NOT_CERTIFIED, Certificate,
                                            certificate_for)

__all__ = ["BOUNDED_APPROXIMATION", "CONSTRAINT_SATISFIED", "EMPIRICAL_ONLY", "EXACT_RETRAIN", "FORMAL",
           "GUARANTEES", "NOT_CERTIFIED", "Certificate", "certificate_for"]
