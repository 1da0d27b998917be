"""The gateway: the HTTP service harnesses use as their LLM provider.

docs/architecture.md, "One model call, step by step", follows one call through these modules.
Entry points: :class:`rolloutd.proxy.gateway.Gateway` (``from_settings``, ``sessions``,
``app``) and :func:`rolloutd.proxy.gateway.serve`. Modules: ``app`` (routes only),
``dialects/`` (wire models and translation), ``backends/`` (inference servers and the pool),
``chat_template`` (rendering and the token chain), ``tool_parsers``, ``sessions``,
``recorder``, ``service`` (the pipeline of one call), ``internal`` (the shapes in between).
"""
