"""The buffer workflow, a training run's durable data buffer, workflow side.

- :mod:`~rolloutd.workflows.buffer.workflow`: ``RolloutBufferWorkflow`` (refill, groups,
  batches, leases, continue-as-new);
- :mod:`~rolloutd.workflows.buffer.models`: its inputs, outputs and carried state;
- :mod:`~rolloutd.workflows.buffer.rules`: a finished group's token-weighted staleness and
  the rules that drop it;
- :mod:`~rolloutd.workflows.buffer.capacity`: the in-flight target from the fleets' capacity.

The other sides of the buffer: the trainer's handle (``take``, ``ack``, ``push``) is
:mod:`rolloutd.trainer_client.buffer`; the file source's rows are read by the eval fleet's
``read_task_chunk`` activity (:mod:`rolloutd.activities.trainer_io`). Workflow code only:
deterministic, no I/O.
"""
