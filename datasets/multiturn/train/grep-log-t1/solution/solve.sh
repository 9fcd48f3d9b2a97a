#!/bin/bash
set -e
cd /app
echo $(grep ERROR app.log | sed 's/.*run: echo \([0-9]*\) .*/\1/') > code.txt
