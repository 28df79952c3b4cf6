#!/usr/bin/env bash
# The GPU check behind docs/BENCHMARKS.md "On a GPU", for a machine with CUDA and PyTorch but none of
# our orchestration packages: the CUDA tests, then one frontier draw on cuda and one on cpu.
# Prepare a workspace where the full .venv is (the check needs no Prefect, MLflow or DVC there):
#   .venv/bin/fedunlearn init .gpu/ws && .venv/bin/fedunlearn --root .gpu/ws prepare --scenario mnist5k-canary-hfl
# and, where the GPU machine lacks them, wheels of pydantic, pydantic_core, annotated-types,
# typing-inspection, hydra-core, omegaconf, antlr4-python3-runtime, pydot, pytz and mlxtend in .whl/
# (the versions of constraints.txt). Then, on the GPU machine: OUT=<dir> bash scripts/gpu_check.sh
set -u
OUT="${OUT:-results/gpu}"; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -p no:cacheprovider -rs -v tests/test_datasets.py tests/test_hf_kcu.py tests/test_krylov.py \
  tests/test_method_conformance.py -k "cuda or datasets" > "$OUT/cuda_tests.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/cuda_tests.txt"; tail -2 "$OUT/cuda_tests.txt"
for dev in cuda cpu; do
  python3 scripts/frontier.py --root .gpu/ws --scenario mnist5k-canary-hfl --draws "${DRAWS:-1}" \
    --device "$dev" --threads "${THREADS:-16}" --out "$OUT/frontier_$dev" > "$OUT/frontier_$dev.log" 2>&1
  echo "frontier $dev rc=$?"; grep -E "^seed|^draw" "$OUT/frontier_$dev.log"
done
