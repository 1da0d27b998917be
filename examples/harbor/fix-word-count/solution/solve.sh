#!/bin/bash
set -euo pipefail
cd /app/textstats
python3 - <<'PY'
from pathlib import Path

path = Path("textstats/counts.py")
source = path.read_text()
source = source.replace('return text.split(" ")', "return text.split()")
source = source.replace(
    "    return sum(len(w) for w in found) / len(found)",
    "    if not found:\n        return 0.0\n    return sum(len(w) for w in found) / len(found)",
)
path.write_text(source)
PY
