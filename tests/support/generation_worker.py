"""A workflow worker serving only GenerationWorkflow on one task queue, as its own process, so
a test can SIGKILL it halfway. Usage: python -m tests.support.generation_worker ADDRESS QUEUE."""

from __future__ import annotations

import asyncio
import sys

from temporalio.client import Client
from temporalio.worker import Worker

from rolloutd.security.connection import data_converter
from rolloutd.workflows.generation.workflow import GenerationWorkflow


async def main(address: str, task_queue: str) -> None:
    client = await Client.connect(address, data_converter=data_converter())
    async with Worker(client, task_queue=task_queue, workflows=[GenerationWorkflow]):
        print("generation worker polling", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
