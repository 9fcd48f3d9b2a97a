#!/bin/bash
set -e
cd /app
sed -i 's/Helo/Hello/' greet.py
