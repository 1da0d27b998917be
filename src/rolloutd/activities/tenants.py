"""The names and models both sides of a tenant's quota share: the session workflows asking for
a slot, the tenant's quota workflow granting it, the client setting the quota
(docs/tenancy.md).

A tenant has a quota of sessions in flight only when someone set one
(:meth:`RolloutClient.set_tenant_quota
<rolloutd.trainer_client.client.RolloutClient.set_tenant_quota>`),
which starts the tenant's own workflow ``tenant/{tenant}``. A session of a tenant without one
pays one signal that finds no workflow, and waits for nothing. There is no lock shared by
tenants: each tenant's workflow counts its own sessions only.
"""

from __future__ import annotations

from pydantic import Field

from rolloutd.payload import Payload

#: signal to the tenant workflow: a session asks for a slot (:class:`TenantSlotRequest`)
ACQUIRE_SIGNAL = "acquire"
#: signal to the tenant workflow: a session gives its slot back, or stops waiting (its
#: workflow id)
RELEASE_SIGNAL = "release"
#: signal from the tenant workflow to a waiting session: its slot is granted
GRANTED_SIGNAL = "tenant_slot_granted"
#: update of the tenant workflow setting its quota (:class:`TenantQuota`)
SET_QUOTA_UPDATE = "set_quota"
#: query of the tenant workflow (:class:`TenantState`)
STATE_QUERY = "state"


def tenant_workflow_id(tenant: str) -> str:
    """Workflow id of a tenant's quota workflow: ``tenant/{tenant}``."""
    return f"tenant/{tenant}"


class TenantSlotRequest(Payload):
    """A session asking its tenant for a slot."""

    workflow_id: str = Field(description="the session's workflow id (the grant is signalled there)")
    priority: int = Field(
        default=3,
        ge=1,
        le=5,
        description="the task's priority key (1 first): a waiting request of a lower key is "
        "granted first, then in arrival order",
    )


class TenantQuota(Payload):
    """A tenant's quota. ``max_sessions_in_flight`` None: no bound (every request is granted)."""

    max_sessions_in_flight: int | None = Field(default=None, ge=1)


class TenantState(Payload):
    """What a tenant's quota workflow holds: its quota, the sessions holding a slot, and the
    requests waiting (in grant order)."""

    tenant: str
    quota: TenantQuota = Field(default_factory=TenantQuota)
    holders: list[str] = Field(default_factory=list)
    waiting: list[TenantSlotRequest] = Field(default_factory=list)
    num_granted: int = Field(
        default=0,
        description="slots granted since the workflow started (over continue-as-new)",
    )
    num_reaped: int = Field(
        default=0,
        description="slots freed because their holder ended without releasing (terminated, "
        "or its release failed), since the workflow started",
    )
