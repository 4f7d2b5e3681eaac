#!/usr/bin/env bash
# GPU measurement pass: the quick suite's device peak bytes in both frameworks, then the estimates
# without allocating (JAX compiled for the GPU) at a real size and, checked against real steps, at
# gpt-small. A few minutes on one GPU; the reports go under ${1:-gpu-report}/.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-report}"
timeout 240 python -m parity.cases.gpu_pass --out "$out"
timeout 120 python -m parity estimate --model gpt2-124m --out "$out/estimate-gpt2-124m" --overwrite
timeout 120 python -m parity estimate --model gpt-small --check --out "$out/estimate-gpt-small" --overwrite
