#!/bin/bash
# Oracle for @@IID@@: apply the gold patch to the repo.
set -euo pipefail
SOLUTION_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${WHARF_TESTBED:-/testbed}"
export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*'
git apply -v "$SOLUTION_DIR/gold.patch" || patch --batch --fuzz=5 -p1 -i "$SOLUTION_DIR/gold.patch"
