#!/bin/bash
# Harbor verifier: check /app/colstats on inputs the agent never saw.
set -u
fail=0
check() {  # check EXPECTED ARGS...
  local expected=$1; shift
  local got
  got=$(/app/colstats "$@" 2>/dev/null) || { echo "FAIL $*: exit $?"; fail=1; return; }
  if [ "$got" != "$expected" ]; then echo "FAIL $*: got '$got', want '$expected'"; fail=1; fi
}
check "count=4 min=-2.50 max=10.00 mean=3.62" /tests/data.csv price
check "count=2 min=1.00 max=7.00 mean=4.00" /tests/data.csv qty
/app/colstats /tests/data.csv nope >/dev/null 2>&1
[ $? -eq 2 ] || { echo "FAIL: an unknown column must exit 2"; fail=1; }
echo $((1 - fail)) > /logs/verifier/reward.txt
