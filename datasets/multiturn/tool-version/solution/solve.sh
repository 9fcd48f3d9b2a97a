#!/bin/bash
set -e
cd /app
echo $(python3 tool.py --version | cut -d' ' -f3) > version.txt
