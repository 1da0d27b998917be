#!/bin/bash
# The repository of the task: limits.ini is changed twice, deleted, then work goes on.
set -euo pipefail
export GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@example.com
export GIT_COMMITTER_NAME=dev GIT_COMMITTER_EMAIL=dev@example.com
mkdir -p "$1/config" && cd "$1"
git init -q -b main
printf 'name = service\n' > README.md
printf '[limits]\nrequests = 10\n' > config/limits.ini
git add -A && git commit -q -m "first version"
printf '[limits]\nrequests = 100\nburst = 20\n' > config/limits.ini
git commit -qam "raise the limits"
printf '[server]\nport = 8080\n' > config/server.ini
git add -A && git commit -q -m "server settings"
git rm -q config/limits.ini && git commit -q -m "clean up config"
printf 'name = service\nowner = ops\n' > README.md
git commit -qam "owner"
git config user.name agent && git config user.email agent@example.com
