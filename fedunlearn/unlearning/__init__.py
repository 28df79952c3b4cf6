"""Unlearning methods behind one interface, found by name in a registry.

Importing this package registers the built-in methods:

* every setting: ``retrain`` (the gold standard: FedAvg, split-NN or D-PSGD from scratch);
* HFL: ``ga`` (projected gradient ascent, PGA), ``finetune`` (the "Natural" baseline),
  ``puf-special`` and ``puf-regular`` (negated pseudo-gradients), ``hf-kcu`` (Krylov causal),
  ``fedquit`` (quasi-competent virtual teacher);
* VFL: ``fedora`` (primal–dual), ``ga``;
* DFL: ``certified-dfu`` and ``certified-dfu-paper`` (certified Newton removal, residual or
  a-priori noise calibration).
"""

from fedunlearn.federation.cost import Cost
from fedunlearn.federation.forget_set import REQUEST_KINDS, ForgetSet, resolve_request
from fedunlearn.unlearning.base import SETTINGS, FederatedState, Monitor, Outcome, UnlearningMethod
from fedunlearn.unlearning.registry import available_methods, get_method, get_method_class, register

# Imported for their @register side effect.
from fedunlearn.unlearning.certified_dfu import CertifiedDFU  # noqa: E402
from fedunlearn.unlearning.dfl_retrain import DecentralizedRetrain  # noqa: E402
from fedunlearn.unlearning.fedora import FedORA  # noqa: E402
from fedunlearn.unlearning.fedquit import FedQUIT  # noqa: E402
from fedunlearn.unlearning.finetune import FineTune  # noqa: E402
from fedunlearn.unlearning.gradient_ascent import GradientAscent  # noqa: E402
from fedunlearn.unlearning.hf_kcu import HFKCU  # noqa: E402
from fedunlearn.unlearning.puf import PUFRegular, PUFSpecial  # noqa: E402
from fedunlearn.unlearning.retrain import Retrain  # noqa: E402
from fedunlearn.unlearning.vfl_baselines import VerticalGradientAscent, VerticalRetrain  # noqa: E402

__all__ = ["REQUEST_KINDS", "SETTINGS", "Cost", "ForgetSet", "FederatedState", "Monitor", "Outcome",
           "UnlearningMethod", "resolve_request", "available_methods", "get_method", "get_method_class",
           "register", "CertifiedDFU", "DecentralizedRetrain", "FedORA", "FedQUIT", "FineTune", "GradientAscent",
           "HFKCU", "PUFRegular", "PUFSpecial", "Retrain", "VerticalGradientAscent", "VerticalRetrain"]
