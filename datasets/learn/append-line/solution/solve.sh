#!/bin/bash
set -e
cd /app
echo 'x = 1' >> config.py
