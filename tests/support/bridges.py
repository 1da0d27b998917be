"""What the bridge tests share: a one-call task run by the shell harness in bwrap, and a
check that a trainer's row carries a session's trace token for token."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: chat calls through the gateway, one conversation: the instruction, then (with a second
#: argument N > 1) "Say it again." after each reply, N calls in all; the last reply is written
#: to reply.txt. Two calls make one trace whose second user turn is not sampled (mask 0).
ASK_PY = r"""
import json, os, sys, urllib.request
messages = [{"role": "user", "content": sys.argv[1]}]
for turn in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
    if turn:
        messages.append({"role": "user", "content": "Say it again."})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps({"model": "m", "messages": messages}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    reply = json.load(urllib.request.urlopen(request, timeout=600))
    content = reply["choices"][0]["message"]["content"] or ""
    messages.append({"role": "assistant", "content": content})
open("reply.txt", "w").write(content)
"""

#: the trainers' environments built by scripts/setup_trainers.sh
TRAINERS_DIR = Path(
    os.environ.get("ROLLOUTD_TRAINERS_DIR", Path.home() / ".cache" / "rolloutd" / "trainers")
)
INSTALL = "scripts/setup_trainers.sh installs it (docs/trainers.md, 'Installing')"


def have(module: str) -> bool:
    """Whether ``module`` imports in this environment (without importing it)."""
    return importlib.util.find_spec(module) is not None


def trainer_python(name: str) -> Path:
    """The interpreter of a trainer's own environment (``verl``, ``skyrl``)."""
    return TRAINERS_DIR / name / "bin" / "python"


def ask_task(max_tokens: int = 16, turns: int = 1) -> dict:
    """Task fields of ``turns`` chat calls in one conversation by the shell harness in bwrap,
    scored 1.0 when the harness ran to its end (``session_completed``)."""
    return {
        "harness": {"type": "shell", "command": f"python3 ask.py {{instruction}} {turns}"},
        "runtime": {"type": "bwrap", "files": {"ask.py": ASK_PY}},
        "evaluator": {"type": "session_completed"},
        "sampling": {"temperature": 1.0, "max_tokens": max_tokens},
    }
