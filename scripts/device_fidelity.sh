#!/usr/bin/env bash
# The simulator against the executor on a CUDA host (a few minutes): `calibrate --quick` measures the
# host (CPU kernels, GPU hit and dense bandwidth, pinned and pageable H2D), the local cases on
# `small` run once each with the dense path and the expert cache on the GPU, then the table of
# measured against predicted: with the measured profile alone (calib), with the constants fitted
# on every trace (error) and on the other cases' traces only (LOCO).
#   usage: scripts/device_fidelity.sh [OUTDIR]     (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUTD=${1:-/tmp/moe-offload-devfid}
mkdir -p "$OUTD"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout "${FIDELITY_TIMEOUT_S:-330}" "$PY" benchmarks/bench_fidelity.py --rounds 1 \
    --base "$OUTD/host-calibrated.yaml" --store "$OUTD/results-fidelity.csv" --out "$OUTD/host-fitted.yaml"
