#!/bin/bash
# Harbor verifier: the file is back with its last content, committed, history kept.
set -u
cd /app/service
git config --global --add safe.directory /app/service
reward=1
[ "$(cat config/limits.ini 2>/dev/null)" = $'[limits]\nrequests = 100\nburst = 20' ] \
  || { echo "limits.ini content"; reward=0; }
[ "$(git show HEAD:config/limits.ini 2>/dev/null)" = $'[limits]\nrequests = 100\nburst = 20' ] \
  || { echo "not committed"; reward=0; }
for subject in "first version" "raise the limits" "server settings" "clean up config" "owner"; do
  git log --format=%s | grep -qx "$subject" || { echo "lost commit: $subject"; reward=0; }
done
[ -z "$(git status --porcelain)" ] || { echo "uncommitted changes"; reward=0; }
echo "$reward" > /logs/verifier/reward.txt
