#!/bin/bash
set -e
cd /app
mv todo.txt log.txt
