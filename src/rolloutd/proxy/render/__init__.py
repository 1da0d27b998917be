"""Text and tokens: the model's chat template and the token chain, messages, and the
tool-call and reasoning parsers that read the sampled text."""
