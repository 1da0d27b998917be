"""A minimal harness for offline generation: one chat call to the session's gateway.

Usage: python3 ask.py INSTRUCTION_FILE OUTPUT_FILE. The gateway is found through the
session's OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL; the answer's text is written to
OUTPUT_FILE, where the evaluator (humaneval, math_answer) reads it.
"""

import json
import os
import sys
import urllib.request

instruction_file, output_file = sys.argv[1:3]
body = {
    "model": os.environ.get("OPENAI_MODEL", "model"),
    "messages": [{"role": "user", "content": open(instruction_file).read()}],
}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
    },
)
with urllib.request.urlopen(request, timeout=600) as response:
    reply = json.load(response)
with open(output_file, "w") as out:
    out.write(reply["choices"][0]["message"].get("content") or "")
