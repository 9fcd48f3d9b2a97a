#!/bin/bash
set -e
cd /app
sed -i 's/Tehre/There/' msg.py
