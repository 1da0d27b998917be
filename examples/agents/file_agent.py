"""A small tool-calling agent for the ``python`` harness: write files and run commands.

Select it in a task with ``{"harness": {"type": "python", "entry": "file_agent:agent",
"files": {"file_agent.py": <this file's text>}}}`` (examples/harnesses.jsonl has the line).
It runs inside the runtime, in its own process, with an ``openai.AsyncOpenAI`` client bound to
the session (rolloutd.sandbox.harnesses.python_runner); every call it makes is recorded by the
gateway token by token. Plain standard library and the openai SDK, nothing of rolloutd.

Keep the names of the cli placeholders in braces out of this file: the python harness writes
``harness.files`` with them filled in.
"""

from __future__ import annotations

import asyncio
import json
import os

import openai

SYSTEM = (
    "You are a coding agent. Use the write_file tool to create files and the run tool "
    "to run shell commands in the working folder. When the task is done, answer with a "
    "one-line summary and no tool call."
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file in the working folder (created or replaced).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "file path, relative to the working folder",
                    },
                    "content": {"type": "string", "description": "the whole file's text"},
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command in the working folder; returns exit code "
            "and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "the command line"}},
                "required": ["command"],
            },
        },
    },
]


def write_file(folder: str, path: str, content: str) -> str:
    """Write ``content`` to ``path`` below ``folder``; refuse paths that leave it."""
    target = os.path.realpath(os.path.join(folder, path))
    if not target.startswith(os.path.realpath(folder) + os.sep):
        return "error: the path must stay inside the working folder"
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w", encoding="utf-8") as f:
        f.write(content)
    return "wrote " + str(len(content)) + " characters to " + path


async def run(folder: str, command: str, timeout_s: float = 30.0) -> str:
    """Run ``command`` with ``/bin/sh`` in ``folder``; exit code and the output's last 4000
    characters."""
    process = await asyncio.create_subprocess_shell(
        command, cwd=folder, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return "error: timed out after " + str(timeout_s) + " s"
    return "exit code " + str(process.returncode) + "\n" + out.decode(errors="replace")[-4000:]


async def call_tool(folder: str, name: str, arguments: str) -> str:
    """Execute one tool call; a bad call becomes an error text the model sees."""
    try:
        args = json.loads(arguments or "{}")
        if name == "write_file":
            return write_file(folder, str(args["path"]), str(args["content"]))
        if name == "run":
            return await run(folder, str(args["command"]))
        return "error: unknown tool " + name
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return "error: " + type(exc).__name__ + ": " + str(exc)


async def agent(
    client: openai.AsyncOpenAI, instruction: str, workdir: str, *, model: str, max_turns: int = 4
) -> str:
    """Call the model, execute its tool calls, repeat until it answers without one.

    Args:
        client: bound to the session.
        instruction: the task's instruction.
        workdir: the working folder (tools act there).
        model: the model name to send.
        max_turns: model calls at most.

    Returns:
        The model's last text answer.
    """
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": instruction},
    ]
    answer = ""
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        answer = message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = await call_tool(workdir, call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer
