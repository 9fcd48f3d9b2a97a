#!/bin/bash
set -e
cd /app
echo 7 > count.txt
