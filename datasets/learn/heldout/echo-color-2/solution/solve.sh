#!/bin/bash
set -e
cd /app
echo yellow > color.txt
