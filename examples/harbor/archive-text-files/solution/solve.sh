#!/bin/bash
set -euo pipefail
cd /app/data
find . -type f -name '*.txt' | sed 's|^\./||' | LC_ALL=C sort > /tmp/files
tar -czf /app/backup.tar.gz -T /tmp/files
wc -l < /tmp/files | tr -d ' ' > /app/count.txt
