#!/bin/bash
set -e
cd /app
cp copy.txt notes.txt
