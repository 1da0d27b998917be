"""The session workflow, one sample of a task from its gateway session to its reward.

- :mod:`~rolloutd.workflows.session.workflow`: ``RolloutSessionWorkflow``, the attempts
  (open, provision, run, collect);
- :mod:`~rolloutd.workflows.session.ending`: how a session ends (teardown, close, the
  failure cause and scoring, build, evaluate, the result);
- :mod:`~rolloutd.workflows.session.failures`: the rules of the failure cause (pure);
- :mod:`~rolloutd.workflows.session.provisioning`: provisioning that waits in the sandbox
  queue with a deadline and gives up when the sandbox fleet is dead;
- :mod:`~rolloutd.workflows.session.policies`: timeouts, heartbeats and retry policies;
- :mod:`~rolloutd.workflows.session.models`: the workflow's input.

Workflow code only: deterministic, no I/O.
"""
