"""rolloutd: durable rollout-as-a-service for RL training of multi-turn LLM agents."""

__version__ = "0.1.0"
