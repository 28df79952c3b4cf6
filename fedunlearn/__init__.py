"""fedunlearn core: data with stable sample IDs, federated engines, unlearning methods,
evaluation and certificates. Pure Python + torch: no Prefect, MLflow, DVC or Great Expectations."""

__version__ = "0.1.0"
