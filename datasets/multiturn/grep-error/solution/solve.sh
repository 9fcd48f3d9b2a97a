#!/bin/bash
set -e
cd /app
echo $(grep ERROR app.log | cut -d' ' -f3) > code.txt
