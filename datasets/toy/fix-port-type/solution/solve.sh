#!/bin/bash
set -e
cd /app
sed -i 's/DEFAULT_PORT = "8080"/DEFAULT_PORT = 8080/' app/settings.py
