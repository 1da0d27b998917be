"""A fresh Temporal namespace on the shared dev server, with rolloutd's search attributes.

Fleets started in their own namespace poll their own copies of the fleet task queues
(``rolloutd-sandbox`` ...), so a test can run fleets unlike the shared ones (a dead sandbox
fleet, a gateway whose backend answers garbage) beside them on one server.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError

from rolloutd.workflows import search


async def fresh_namespace(address: str, prefix: str = "test", timeout_s: float = 30.0) -> str:
    """Register a namespace named ``{prefix}-{random}`` with rolloutd's search attributes
    and wait until both are usable.

    Returns:
        The namespace's name.
    """
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(address)
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=name, workflow_execution_retention_period=Duration(seconds=86_400)
        )
    )
    kinds = {
        kind: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{kind.upper()}")
        for kind in set(search.DEFINITIONS.values())
    }
    deadline = time.monotonic() + timeout_s
    added = False
    while True:
        try:
            if not added:
                await client.operator_service.add_search_attributes(
                    AddSearchAttributesRequest(
                        namespace=name,
                        search_attributes={
                            attr: kinds[kind] for attr, kind in search.DEFINITIONS.items()
                        },
                    )
                )
                added = True
            listed = await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=name)
            )
            if set(search.DEFINITIONS) <= set(listed.custom_attributes):
                return name
        except RPCError:  # the new namespace is not known everywhere yet
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"namespace {name} never got its search attributes")
        await asyncio.sleep(0.2)
