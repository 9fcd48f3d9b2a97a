#!/bin/bash
# Build wharf_seal.c (the pytest records' sealer, an audit hook in C) for the interpreter PY, next
# to pytest_report.py, which loads it. Run by `make setup`; needs gcc and PY's headers. Without it
# the records are sealed in Python (reward.json: sealed 0; docs/judges.md).
# usage: build_seal.sh PY
set -e
PY="${1:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
read -r INC SUFFIX < <("$PY" -c 'import sysconfig as s; print(s.get_paths()["include"], s.get_config_var("EXT_SUFFIX"))')
gcc -O2 -Wall -Werror -shared -fPIC -I"$INC" -o "$HERE/wharf_seal$SUFFIX.tmp" "$HERE/wharf_seal.c"
mv "$HERE/wharf_seal$SUFFIX.tmp" "$HERE/wharf_seal$SUFFIX"
