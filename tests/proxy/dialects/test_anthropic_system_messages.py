"""Claude Code (2.1.x) sends ``system`` messages inside ``messages``: they are accepted after
the first message and reach the prompt as system turns."""

from __future__ import annotations

import httpx

from rolloutd.proxy.http.server import Gateway
from rolloutd.store import CompletionLog


async def test_a_system_message_inside_messages_is_a_system_turn(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await gateway.sessions.open_session("t/0", "t")
    response = await client.post(
        f"/s/{info.session_key}/v1/messages",
        json={
            "max_tokens": 16,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "system", "content": [{"type": "text", "text": "Reminder: be kind."}]},
                {"role": "user", "content": "Again"},
            ],
        },
    )
    assert response.status_code == 200, response.text
    [completion] = CompletionLog(gateway.store, "t/0").read_all()
    assert [m["role"] for m in completion.messages] == ["system", "user", "system", "user"]
    assert completion.messages[2]["content"] == "Reminder: be kind."
    prompt = gateway.template.decode(completion.prompt_ids)
    assert "<|im_start|>system\nReminder: be kind.<|im_end|>" in prompt


async def test_a_conversation_cannot_start_with_a_system_message(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await gateway.sessions.open_session("t/1", "t")
    response = await client.post(
        f"/s/{info.session_key}/v1/messages",
        json={"max_tokens": 16, "messages": [{"role": "system", "content": "x"}]},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
