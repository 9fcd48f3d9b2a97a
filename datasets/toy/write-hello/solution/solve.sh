#!/bin/bash
set -e
cd /app
echo hello > hello.txt
