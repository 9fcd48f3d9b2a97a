#!/bin/bash
set -e
cd /app
echo 'y = 10' >> config.py
