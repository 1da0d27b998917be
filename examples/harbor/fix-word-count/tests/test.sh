#!/bin/bash
# Harbor verifier: run the hidden tests, write the reward.
cd /app/textstats
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
