#!/bin/bash
set -euo pipefail
cat > /app/colstats <<'PY'
#!/usr/bin/env python3
"""Statistics of one numeric column of a CSV file."""
import csv
import sys


def main() -> int:
    path, column = sys.argv[1], sys.argv[2]
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if column not in (reader.fieldnames or []):
            print(f"colstats: no column {column!r} in {path}", file=sys.stderr)
            return 2
        values = [float(row[column]) for row in reader if row[column].strip()]
    mean = sum(values) / len(values)
    print(f"count={len(values)} min={min(values):.2f} max={max(values):.2f} mean={mean:.2f}")
    return 0


sys.exit(main())
PY
chmod +x /app/colstats
