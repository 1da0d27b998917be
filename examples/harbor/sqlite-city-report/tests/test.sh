#!/bin/bash
# Harbor verifier: compare /app/report.csv with the answer computed here.
set -u
want=$'city,total\nOslo,30.50\nBerlin,15.75\nLima,7.33'
got=$(tr -d '\r' < /app/report.csv 2>/dev/null | sed -e '/^$/d')
rows=$(($(printf '%s\n' "$got" | wc -l) - 1))
if [ "$got" = "$want" ] && [ "$rows" = "$EXPECTED_ROWS" ]; then
  echo '{"reward": 1.0, "rows": '"$rows"'}' > /logs/verifier/reward.json
else
  echo "report.csv: $got"
  echo '{"reward": 0.0, "rows": '"$rows"'}' > /logs/verifier/reward.json
fi
