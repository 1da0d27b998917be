"""The probe conversations a chat template is checked on when it is loaded: a fast path
(incremental rendering, the direct render of the compiled template, encoding by turns, the
decoder) is used only when it gives exactly what the plain path gives on every one of them,
with and without tools.
"""

from __future__ import annotations

import json
from typing import Any

#: the user message and the assistant answer of the smallest probe conversation
PROBE_USER = "ping"
PROBE_ANSWER = "rolloutd-probe-answer"

#: the tool the probe conversations offer
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "A probe.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }
]


def probe_call(i: int) -> dict[str, Any]:
    """The ``i``-th probe tool call (``call_{i}``, arguments ``{"x": "<i>"}``)."""
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "probe_tool", "arguments": json.dumps({"x": str(i)})},
    }


#: conversations on which incremental rendering must equal the full render, after every
#: assistant turn but the last (``ChatTemplate._probe_incremental``).
PROBES: list[list[dict[str, Any]]] = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
    ],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
        {"role": "user", "content": "e"},
    ],
    [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [probe_call(1)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
        {
            "role": "assistant",
            "content": "thinking",
            "tool_calls": [probe_call(2), probe_call(3)],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "r2"},
        {"role": "tool", "tool_call_id": "call_3", "content": "r3"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "", "tool_calls": [probe_call(4)]},
        {"role": "tool", "tool_call_id": "call_4", "content": "r4"},
        {"role": "user", "content": "and?"},
    ],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [probe_call(1)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "late system"},
        {"role": "user", "content": "b"},
    ],
]


#: more conversations on which rendering the compiled template directly must equal
#: apply_chat_template (``ChatTemplate._probe_direct``): keys set to None, reasoning fields
DIRECT_PROBES: list[list[dict[str, Any]]] = [
    [
        {"role": "system", "content": "s", "name": None},
        {"role": "user", "content": "a", "tool_calls": None},
        {"role": "assistant", "content": "b", "reasoning_content": "why"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": None, "reasoning": "r", "tool_calls": [probe_call(5)]},
        {"role": "tool", "tool_call_id": "call_5", "content": "r5", "name": "probe_tool"},
    ],
]
