"""Signals a workflow sends to another workflow, shielded from its own cancellation.

A workflow cancelled while its signal to another workflow is in flight would cancel the signal
command; when the signal's outcome (delivered, or failed: the receiver is gone) lands in the
same workflow task as the cancel, the SDK's state machine refuses the cancel of a finished
signal ("[TMPRL1100] Nondeterminism error: Invalid transition in state machine") and the
workflow task fails on every retry: the workflow is stuck running. Seen on a session cancelled
right after it asked its tenant for a slot. A signal is one short command: it is let finish,
and the cancellation is raised once it has. Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio import workflow


async def send(workflow_id: str, signal: str, arg: Any) -> None:
    """Signal ``workflow_id`` and wait for the outcome even when this workflow is cancelled
    meanwhile (the cancellation is raised afterwards).

    Raises:
        temporalio.exceptions.ApplicationError: the signal failed (the receiver does not run:
            ``type`` ``ExternalWorkflowExecutionNotFound``).
        asyncio.CancelledError: this workflow was cancelled while the signal was in flight
            (after the signal's outcome).
    """
    sending = asyncio.ensure_future(
        workflow.get_external_workflow_handle(workflow_id).signal(signal, arg)
    )
    try:
        await asyncio.shield(sending)
    except asyncio.CancelledError:
        # let the one command finish; its failure does not hide the cancellation
        with contextlib.suppress(Exception):
            await sending
        raise
