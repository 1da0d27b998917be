"""Search attributes that make rollouts findable in the Temporal UI and ``temporal workflow list``.

They must be registered on the server (``rolloutd up`` and the test fixture do it; in a cluster:
``temporal operator search-attribute create --name RolloutStatus --type Keyword`` and so on).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey, SearchAttributePair

TASK_ID = SearchAttributeKey.for_keyword("RolloutTaskId")
HARNESS = SearchAttributeKey.for_keyword("RolloutHarness")
STATUS = SearchAttributeKey.for_keyword("RolloutStatus")
REWARD = SearchAttributeKey.for_float("RolloutReward")
POLICY_VERSION = SearchAttributeKey.for_int("RolloutPolicyVersion")
#: a session's failure cause kind (docs/failures.md); unset when it ran to its end
FAILURE = SearchAttributeKey.for_keyword("RolloutFailure")
#: a task's and a session's tenant (what a tenant's ``GET /rollout/status`` counts)
TENANT = SearchAttributeKey.for_keyword("RolloutTenant")

#: name -> Temporal type, for ``temporal server start-dev --search-attribute NAME=TYPE``.
DEFINITIONS: dict[str, str] = {
    TASK_ID.name: "Keyword",
    HARNESS.name: "Keyword",
    STATUS.name: "Keyword",
    REWARD.name: "Double",
    POLICY_VERSION.name: "Int",
    FAILURE.name: "Keyword",
    TENANT.name: "Keyword",
}


def upsert(
    *,
    task_id: str | None = None,
    harness: str | None = None,
    status: str | None = None,
    reward: float | None = None,
    policy_version: int | None = None,
    failure: str | None = None,
    tenant: str | None = None,
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
    if pairs:
        workflow.upsert_search_attributes(pairs)
