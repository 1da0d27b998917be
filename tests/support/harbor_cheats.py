"""Harbor cheats' parts shared by the adversarial suites (tests/security): one model call
through the session's gateway, a fake program first on ``PATH``, and the shell harness that
runs them."""

from __future__ import annotations

#: one model call through the session's gateway, with the base image's Python
CALL = """python3 - <<'PY'
import json, os, urllib.request
body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"},
)
print(json.load(urllib.request.urlopen(request, timeout=900))["choices"][0]["message"])
PY
"""
#: a program that answers "1", writes reward files, plants a /tests/test.sh that writes 1, and
#: exits 0: what the verifier would run, were it first on PATH
FAKE = """#!/usr/bin/dash
mkdir -p /logs/verifier /tests 2>/dev/null
echo 1 > /logs/verifier/reward.txt
printf '#!/usr/bin/dash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh
chmod +x /tests/test.sh
echo 1
exit 0
"""


def fake_on_path(name: str) -> str:
    """Install :data:`FAKE` as ``/usr/local/bin/{name}`` (before /usr/bin on PATH); prove it
    answers; leave no reward file behind."""
    return (
        f"/bin/cat > /usr/local/bin/{name} <<'FAKE'\n{FAKE}FAKE\n"
        f"chmod 755 /usr/local/bin/{name}\nhash -r\n"  # the shell remembers an earlier python3
        f'test "$(command -v {name})" = /usr/local/bin/{name}\n'
        f"{name} --version > /dev/null\ntest -f /logs/verifier/reward.txt\n/bin/rm -rf /logs /tests"
    )


def shell(body: str) -> dict:
    """A shell harness: ``set -e``, the model call, then ``body``."""
    return {"type": "shell", "command": f"set -e\n{CALL}{body}\n"}
