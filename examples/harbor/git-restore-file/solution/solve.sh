#!/bin/bash
set -euo pipefail
cd /app/service
deleted=$(git rev-list -n 1 HEAD -- config/limits.ini)
git checkout "$deleted^" -- config/limits.ini
git commit -q -m "restore config/limits.ini"
