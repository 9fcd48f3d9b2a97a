#!/bin/bash
set -e
cd /app
sed -i 's/range(1, n)/range(1, n + 1)/' mathutil.py
