#!/bin/bash
set -e
cd /app
mv final.txt old.txt
