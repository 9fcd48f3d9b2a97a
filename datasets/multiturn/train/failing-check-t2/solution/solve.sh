#!/bin/bash
set -e
cd /app
echo $(python3 check.py 2>&1 | sed -n 's/^echo \(.*\) > .*/\1/p') > n.txt
