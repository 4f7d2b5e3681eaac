#!/usr/bin/env bash
# GPU measurement pass of the quick suite (device peak bytes, both frameworks); a few minutes on one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 290 python -m parity.cases.gpu_pass --out "${1:-gpu-report}"
