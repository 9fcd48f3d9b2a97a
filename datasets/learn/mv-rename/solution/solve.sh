#!/bin/bash
set -e
cd /app
mv draft.txt final.txt
