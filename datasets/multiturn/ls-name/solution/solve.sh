#!/bin/bash
set -e
cd /app
echo $(basename box/*.txt .txt) > name.txt
