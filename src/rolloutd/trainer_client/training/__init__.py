"""The training side of the trainer client: what a trainer does with the results.

- :mod:`~rolloutd.trainer_client.training.exports`: batches to verl-style tensors,
  slime-style samples, OpenAI messages JSONL (SFT) and Parquet;
- :mod:`~rolloutd.trainer_client.training.grpo`: GRPO advantages, DAPO's filter, per-session
  trace weights;
- :mod:`~rolloutd.trainer_client.training.weight_sync`: new weights to the engines through the
  gateway's admin API;
- :mod:`~rolloutd.trainer_client.training.gguf_export` (needs ``gguf`` and numpy) and
  :mod:`~rolloutd.trainer_client.training.probe` (needs torch): imported by their own paths,
  so this face imports neither.

The client side (:mod:`rolloutd.trainer_client`) imports nothing from here.
"""

from rolloutd.scoring import failure_of, scored_sessions
from rolloutd.trainer_client.training.exports import (
    failed_cause,
    parquet_schema,
    to_openai_messages_jsonl,
    to_parquet,
    to_slime_samples,
    to_verl_batch,
    trace_reward,
)
from rolloutd.trainer_client.training.grpo import (
    dapo_filter,
    group_advantages,
    group_rewards,
    is_zero_variance,
    trace_weights,
)

__all__ = [
    "dapo_filter",
    "failed_cause",
    "failure_of",
    "group_advantages",
    "group_rewards",
    "is_zero_variance",
    "parquet_schema",
    "scored_sessions",
    "to_openai_messages_jsonl",
    "to_parquet",
    "to_slime_samples",
    "to_verl_batch",
    "trace_reward",
    "trace_weights",
]
