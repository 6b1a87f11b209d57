#!/usr/bin/env bash
# Install handformer and its development tools into the current Python environment.
# Torch first: with no torch present, pin the CPU build 2.13.0 (a plain `torch` requirement would
# pull a multi-GB CUDA build). An existing torch >= 2.4 is kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet torch==2.13.0
fi
"$PY" -m pip install --quiet -e ".[dev]"
