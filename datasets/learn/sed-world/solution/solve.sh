#!/bin/bash
set -e
cd /app
sed -i 's/Wrold/World/' msg.py
