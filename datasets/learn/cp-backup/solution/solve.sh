#!/bin/bash
set -e
cd /app
cp notes.txt backup.txt
