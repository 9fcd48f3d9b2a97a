#!/bin/bash
set -e
cd /app
echo $(wc -l < names.txt) > count.txt
