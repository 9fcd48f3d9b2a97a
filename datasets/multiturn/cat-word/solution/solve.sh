#!/bin/bash
set -e
cd /app
echo $(sed 's/.* is \(.*\)\./\1/' word.txt) > answer.txt
