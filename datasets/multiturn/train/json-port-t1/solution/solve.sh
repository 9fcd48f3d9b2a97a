#!/bin/bash
set -e
cd /app
python3 -c 'import json; print(json.load(open("config.json"))["port"])' > port.txt
