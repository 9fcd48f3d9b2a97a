#!/bin/bash
set -e
cd /app
echo $(python3 tool.py --help | sed -n 's/^echo \(.*\) > .*/\1/p') > version.txt
