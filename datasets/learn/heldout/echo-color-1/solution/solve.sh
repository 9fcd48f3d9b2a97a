#!/bin/bash
set -e
cd /app
echo green > color.txt
