"""What the warm process of served flow runs (``flows.warm``) does once, at its start, for every run
it forks: import every served flow and what they import (torch, Prefect, MLflow, DVC), Great
Expectations, MLflow's SQL stores and its probe model, DVC's API and a first figure (``tasks.preload``) — about 7 s on 2 cores
that a spawned flow run paid itself, 3–4 s of them inside a deletion batch; and have Prefect's API
clients share one TLS context per CA file (``flows.warm.share_tls_contexts``; each forked run builds
its own at its first client).

Then everything it holds is frozen out of garbage collection (``gc.freeze``, the standard library's
recipe for a parent that forks without exec): a full collection in a run walked these 880,000
objects each time, 0.45 s, and a deletion batch triggers several; frozen, the forked runs' pages of
them also stay shared rather than copied.

No tensor work beyond the 2×2 probe: an OpenMP parallel region run here would leave GNU OpenMP's
thread pool half-alive in every forked run, whose first parallel region then hangs (seen with a
2000×2000 matmul here). Imported for these effects, by the forkserver only.
"""

from __future__ import annotations

import gc

import tqdm

import flows.serve  # noqa: F401 — every served flow, and through them the whole application
import prefect.utilities.visualization  # noqa: F401 — imported by every (sub-)flow call: 0.04 s of a batch
from flows.warm import share_tls_contexts
from tasks import preload

share_tls_contexts()
tqdm.tqdm.monitor_interval = 0  # DVC's progress bars would start tqdm's monitor thread here, one the forks lose
preload.now(*preload.BATCH_LIBRARIES, preload.import_registry_stores, preload.prepare_dvc, preload.prepare_plotting)
gc.freeze()
