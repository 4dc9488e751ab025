#!/usr/bin/env bash
# Set up (if needed), then run the whole test suite: lint, unit tests, and the multi-PE tests
# under the project's launcher at 1, 2 and 4 PEs over every transport.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "test: ruff"
.venv/bin/ruff check .
echo "test: pytest"
exec .venv/bin/python -m pytest -q -ra --timeout 900 tests "$@"
