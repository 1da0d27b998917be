#!/bin/bash
# Harbor verifier: the archive holds exactly the .txt files, with relative paths.
set -u
want=$'notes/a.txt\nnotes/b.txt\nnotes/old/c.txt\nreadme.txt'
got=$(tar -tzf /app/backup.tar.gz 2>/dev/null | grep -v '/$' | sed 's|^\./||' | LC_ALL=C sort)
reward=1
[ "$got" = "$want" ] || { echo "archive holds: $got"; reward=0; }
tar -tzf /app/backup.tar.gz 2>/dev/null | grep -q '^/' && { echo "absolute paths"; reward=0; }
mkdir -p /tmp/check && tar -xzf /app/backup.tar.gz -C /tmp/check 2>/dev/null
[ "$(cat /tmp/check/notes/old/c.txt 2>/dev/null)" = "archived long ago" ] || reward=0
[ "$(tr -d '[:space:]' < /app/count.txt 2>/dev/null)" = "4" ] || { echo "count.txt"; reward=0; }
[ -f /app/data/notes/d.md ] && [ -f /app/data/readme.txt ] || { echo "data changed"; reward=0; }
echo "$reward" > /logs/verifier/reward.txt
