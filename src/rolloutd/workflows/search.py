"""Search attributes that make rollouts findable in the Temporal UI and ``temporal workflow list``.

They must be registered on the server (``rolloutd up`` and the test fixture do it; in a cluster:
``temporal operator search-attribute create --name RolloutStatus --type Keyword`` and so on).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

TASK_ID = SearchAttributeKey.for_keyword("RolloutTaskId")
HARNESS = SearchAttributeKey.for_keyword("RolloutHarness")
STATUS = SearchAttributeKey.for_keyword("RolloutStatus")
REWARD = SearchAttributeKey.for_float("RolloutReward")
POLICY_VERSION = SearchAttributeKey.for_int("RolloutPolicyVersion")
#: a session's failure cause kind (docs/failures.md); unset when it ran to its end
FAILURE = SearchAttributeKey.for_keyword("RolloutFailure")
#: a task's and a session's tenant (what a tenant's ``GET /rollout/status`` counts)
TENANT = SearchAttributeKey.for_keyword("RolloutTenant")
#: a session whose task judges its samples as a group: its reward is set by the task, after
#: the session ended (docs/judges.md)
JUDGED_BY_GROUP = SearchAttributeKey.for_bool("RolloutJudgedByGroup")

#: name -> Temporal type, for ``temporal server start-dev --search-attribute NAME=TYPE``.
DEFINITIONS: dict[str, str] = {
    TASK_ID.name: "Keyword",
    HARNESS.name: "Keyword",
    STATUS.name: "Keyword",
    REWARD.name: "Double",
    POLICY_VERSION.name: "Int",
    FAILURE.name: "Keyword",
    TENANT.name: "Keyword",
    JUDGED_BY_GROUP.name: "Bool",
}


def started(
    *, task_id: str, harness: str, tenant: str, status: str = "running"
) -> TypedSearchAttributes:
    """A workflow's search attributes at its start, given to the start itself (a child
    workflow's ``search_attributes``): they are in its first event, and the workflow upserts
    nothing until it ends (:func:`upsert_unless_started`)."""
    return TypedSearchAttributes(
        [
            TASK_ID.value_set(task_id),
            HARNESS.value_set(harness),
            STATUS.value_set(status),
            TENANT.value_set(tenant),
        ]
    )


def upsert_unless_started(
    *, task_id: str, harness: str, tenant: str, status: str = "running"
) -> None:
    """Upsert the attributes of :func:`started` unless the workflow was started with them (one
    ``UpsertWorkflowSearchAttributes`` event fewer a workflow; a workflow started without
    them, by a client, still gets them)."""
    if workflow.info().typed_search_attributes.get(TASK_ID) is None:
        upsert(task_id=task_id, harness=harness, status=status, tenant=tenant)


def upsert(
    *,
    task_id: str | None = None,
    harness: str | None = None,
    status: str | None = None,
    reward: float | None = None,
    policy_version: int | None = None,
    failure: str | None = None,
    tenant: str | None = None,
    judged_by_group: bool | None = None,
) -> None:
    """Upsert the given search attributes on the current workflow (None leaves one unset)."""
    pairs: list[SearchAttributePair] = []
    if task_id is not None:
        pairs.append(TASK_ID.value_set(task_id))
    if harness is not None:
        pairs.append(HARNESS.value_set(harness))
    if status is not None:
        pairs.append(STATUS.value_set(status))
    if reward is not None:
        pairs.append(REWARD.value_set(reward))
    if policy_version is not None:
        pairs.append(POLICY_VERSION.value_set(policy_version))
    if failure is not None:
        pairs.append(FAILURE.value_set(failure))
    if tenant is not None:
        pairs.append(TENANT.value_set(tenant))
    if judged_by_group is not None:
        pairs.append(JUDGED_BY_GROUP.value_set(judged_by_group))
    if pairs:
        workflow.upsert_search_attributes(pairs)
