#!/bin/bash
set -e
cd /app
sed -i 's/a + b/a ** b/' ops.py
