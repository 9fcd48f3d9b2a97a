#!/bin/bash
set -e
cd /app
sed -i 's/Eatrh/Earth/' msg.py
