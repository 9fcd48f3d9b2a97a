#!/bin/bash
set -e
cd /app
echo 'limit = 7' >> config.py
