#!/bin/bash
set -e
cd /app
mkdir todo
