"""Tenant quotas from the trainer's side: set a tenant's bound of sessions in flight, read its
state (docs/tenancy.md).

A quota lives in the tenant's own workflow ``tenant/{tenant}``
(:class:`~rolloutd.workflows.tenants.TenantWorkflow`), started by the first
:func:`set_tenant_quota`; a tenant without one has no bound.
"""

from __future__ import annotations

from temporalio.client import Client, WithStartWorkflowOperation
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from rolloutd import task_queues
from rolloutd.activities.tenants import (
    SET_QUOTA_UPDATE,
    STATE_QUERY,
    TenantQuota,
    TenantState,
    tenant_workflow_id,
)
from rolloutd.types import check_tenant
from rolloutd.workflows.tenants import TenantInput, TenantWorkflow

__all__ = ["TenantState", "set_tenant_quota", "tenant_state"]


async def set_tenant_quota(
    client: Client, tenant: str, max_sessions_in_flight: int | None
) -> TenantState:
    """Set a tenant's quota, starting its quota workflow when it has none
    (update-with-start: one call, no race between two setters).

    Args:
        client: a Temporal client with rolloutd's data converter.
        tenant: the tenant (as ``TaskRequest.tenant``).
        max_sessions_in_flight: the bound (>= 1), or None for none.

    Returns:
        The tenant's state after the update.

    Raises:
        ValueError: ``tenant`` is not a valid tenant name, or the bound is below 1.
        temporalio.client.WorkflowUpdateFailedError: the workflow refused the update.
    """
    check_tenant(tenant)
    if max_sessions_in_flight is not None and max_sessions_in_flight < 1:
        raise ValueError(
            f"max_sessions_in_flight must be >= 1 or None, not {max_sessions_in_flight}"
        )
    start = WithStartWorkflowOperation(
        TenantWorkflow.run,
        TenantInput(state=TenantState(tenant=tenant)),
        id=tenant_workflow_id(tenant),
        task_queue=task_queues.WORKFLOWS,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return await client.execute_update_with_start_workflow(
        SET_QUOTA_UPDATE,
        TenantQuota(max_sessions_in_flight=max_sessions_in_flight),
        start_workflow_operation=start,
        result_type=TenantState,
    )


async def tenant_state(client: Client, tenant: str) -> TenantState | None:
    """A tenant's quota workflow's state, or None when the tenant has no quota workflow."""
    try:
        return await client.get_workflow_handle(tenant_workflow_id(tenant)).query(
            STATE_QUERY, result_type=TenantState
        )
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
