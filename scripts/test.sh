#!/usr/bin/env bash
# Fresh machine -> full test suite: set up .venv (CPU torch pin first), then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
