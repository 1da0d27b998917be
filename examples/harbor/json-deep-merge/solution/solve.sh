#!/bin/bash
set -euo pipefail
cat > /app/merge.py <<'PY'
"""Deep merge of JSON-like values."""

import json
import sys


def deep_merge(base, override):
    """``override`` merged into ``base``; neither argument is changed."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return override
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif key in merged:
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


if __name__ == "__main__":
    with open(sys.argv[1]) as a, open(sys.argv[2]) as b:
        print(json.dumps(deep_merge(json.load(a), json.load(b)), sort_keys=True, indent=2))
PY
