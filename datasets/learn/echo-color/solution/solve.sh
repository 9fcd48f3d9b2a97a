#!/bin/bash
set -e
cd /app
echo blue > color.txt
