#!/usr/bin/env bash
# Set up everything and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh dev
bash infra/services.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
