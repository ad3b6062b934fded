#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it.  Extra arguments go to pytest
# (e.g. `scripts/test.sh -k recovery`, or `-m soak` for the long soak runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -ra "$@"
