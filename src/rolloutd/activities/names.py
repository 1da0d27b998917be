"""Every activity's name, once: the activities are defined with these names
(``@activity.defn(name=...)``) and the workflows call them by these names, imported at the top
of each module, so a misspelt name fails when the module is imported, not when a workflow first
calls it (tests/workflows/test_activity_names.py; Temporal itself would only answer an unknown
name with an activity task no worker ever takes).

Grouped by the fleet that runs them (docs/architecture.md, "Processes").
"""

from __future__ import annotations

__all__ = [
    "ALL",
    "ASSEMBLE_GROUP",
    "AWAIT_TASK",
    "BACKEND_CAPACITY",
    "BACKEND_HEALTH",
    "BUILD_TRAJECTORY",
    "CANCEL_WORKFLOWS",
    "CHECK_EVALUATOR",
    "CLOSED_WORKFLOWS",
    "CLOSE_SESSION",
    "COLLECT_ARTIFACTS",
    "EVALUATE",
    "JOURNAL_ROW",
    "JUDGE",
    "JUDGE_FAILED",
    "OPEN_SESSION",
    "PLAN_GENERATION",
    "POST_CALLBACK",
    "PROVISION_RUNTIME",
    "READ_TASK_CHUNK",
    "READ_TASK_REQUEST",
    "RESCORE_SESSION",
    "RESTORE_FINAL_STATE",
    "REVERIFY_PLAN",
    "RUN_HARNESS",
    "SANDBOX_CAPACITY",
    "STORE_GROUP",
    "STORE_GROUP_PART",
    "STORE_TASK_REQUEST",
    "SUMMARIZE_REVERIFY",
    "TEARDOWN_RUNTIME",
    "WRITE_GENERATION_OUTPUTS",
]

# -- workflows fleet: local activities of the workflow worker
#: cancel a task's sessions (rolloutd.activities.cancel)
CANCEL_WORKFLOWS = "cancel_workflows"
#: the sandbox fleet's bound of running sessions (rolloutd.activities.capacity)
SANDBOX_CAPACITY = "sandbox_capacity"

# -- sandbox fleet (rolloutd.activities.sandbox)
PROVISION_RUNTIME = "provision_runtime"
RUN_HARNESS = "run_harness"
COLLECT_ARTIFACTS = "collect_artifacts"
TEARDOWN_RUNTIME = "teardown_runtime"
#: a stored final state into a runtime provisioned for a re-score (rolloutd reverify)
RESTORE_FINAL_STATE = "restore_final_state"

# -- gateway fleet (rolloutd.activities.gateway)
OPEN_SESSION = "open_session"
CLOSE_SESSION = "close_session"
BUILD_TRAJECTORY = "build_trajectory"
BACKEND_HEALTH = "backend_health"
BACKEND_CAPACITY = "backend_capacity"

# -- eval fleet: evaluation and the task's blob-store steps (rolloutd.activities.evaluation)
EVALUATE = "evaluate"
#: a registered evaluator checked on an eval host (the fleet registry asks it)
CHECK_EVALUATOR = "check_evaluator"
READ_TASK_REQUEST = "read_task_request"
STORE_TASK_REQUEST = "store_task_request"
STORE_GROUP = "store_group"
STORE_GROUP_PART = "store_group_part"
ASSEMBLE_GROUP = "assemble_group"
# -- eval fleet, judge queue: LLM judges (rolloutd.activities.judging)
#: judge stored sessions (one, or a group) through a judge session at the gateway
JUDGE = "judge"
#: a judging given up: the failure written into the stored trajectories (eval queue)
JUDGE_FAILED = "judge_failed"
# -- eval fleet: the trainer's I/O (rolloutd.activities.trainer_io, .closed)
READ_TASK_CHUNK = "read_task_chunk"
POST_CALLBACK = "post_callback"
CLOSED_WORKFLOWS = "closed_workflows"
# -- eval fleet: offline generation (rolloutd.generation.activities)
PLAN_GENERATION = "plan_generation"
JOURNAL_ROW = "journal_row"
AWAIT_TASK = "await_task"
WRITE_GENERATION_OUTPUTS = "write_generation_outputs"
# -- eval fleet: scoring stored sessions again (rolloutd.activities.reverify)
REVERIFY_PLAN = "reverify_plan"
RESCORE_SESSION = "rescore_session"
SUMMARIZE_REVERIFY = "summarize_reverify"

#: every activity name above
ALL: frozenset[str] = frozenset(
    value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str)
)
