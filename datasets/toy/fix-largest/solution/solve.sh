#!/bin/bash
set -e
cd /app
sed -i 's/min(xs)/max(xs)/' stats.py
