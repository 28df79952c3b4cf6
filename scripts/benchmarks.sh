#!/usr/bin/env bash
# Reproduces every table of docs/BENCHMARKS.md (results under results/<name>/results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
fu=".venv/bin/fedunlearn"
run() { local name=$1; shift; echo "== $name: fedunlearn benchmark $*"; "$fu" benchmark --out "results/$name" "$@"; }

# Horizontal FL (issues 3 and 5): the backdoor carries the forgetting signal on MNIST.
run hfl-client  --scenario mnist5k-hfl --request client:largest --methods all --backdoor
run hfl-samples --scenario mnist5k-hfl --request samples:0.5@largest --methods all --backdoor
# HF-KCU under its paper's protocol (5 local epochs per round) with a 256-sample Hessian batch.
run hfl-client-e5 --scenario mnist5k-hfl --request client:largest --methods hf-kcu --backdoor --local-epochs 5 \
    --method-options '{"hf-kcu": {"hessian_batch": 256}}'
# Vertical FL (issue 6).
run vfl-mnist-class   --scenario mnist5k-vfl --request class:1,7 --methods all
run vfl-bc-samples    --scenario breast_cancer-vfl --request samples:0.5@all --methods all
# Decentralized FL (issue 7), logistic regression on PCA-50 unit-norm features, ε = 1, δ = 1e-5.
run dfl-ring-samples  --scenario mnist5k-dfl-ring --request samples:0.1@all --methods all
run dfl-er-class      --scenario mnist5k-dfl-er --request class:0 --methods all
run dfl-er-client     --scenario mnist5k-dfl-er --request client:3 --methods all
