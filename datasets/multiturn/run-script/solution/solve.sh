#!/bin/bash
set -e
cd /app
echo $(python3 code.py | cut -d' ' -f2) > answer.txt
