#!/bin/bash
set -e
cd /app
echo $(sed -n 's/^echo \(.*\) > .*/\1/p' note.txt) > answer.txt
