#!/bin/bash
set -e
cd /app
echo 43 > count.txt
