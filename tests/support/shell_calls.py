"""Shell harness commands that make model calls through the session's gateway (curl)."""

from __future__ import annotations


def call(content: str) -> str:
    """One chat call with ``content`` (curl fails on an error answer: ``-f``)."""
    return (
        'curl -sS -f -o reply.json "$OPENAI_BASE_URL/chat/completions" '
        "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
        '-d \'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", '
        f'"content": "{content}"}}]}}\''
    )
