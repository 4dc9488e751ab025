#!/usr/bin/env bash
# Set up (if needed), then run the main job: a 4-PE ring exchange and distributed counter, on
# the host heap and on the GPU heap (lavapipe where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vkshmem run -n "${NPES:-4}" --timeout 300 examples/demo.py
