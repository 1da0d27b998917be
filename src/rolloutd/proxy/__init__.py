"""The gateway: the HTTP service harnesses use as their LLM provider.

The subpackages follow one model call, top to bottom (docs/architecture.md, "One model call,
step by step"); a layers contract in pyproject.toml keeps every import pointing down:

- ``http/``: the server and the app: one router module per dialect and one for admin;
  transport only. Entry points: :class:`rolloutd.proxy.http.server.Gateway`
  (``from_settings``, ``sessions``, ``app``) and :func:`rolloutd.proxy.http.server.serve`.
- ``dialects/``: each dialect's wire models and pure translation to and from the internal
  request and response.
- ``calls/``: the call service (one call from the translated request to the recorded answer),
  passthrough calls, sampling parameters.
- ``sessions/``: sessions and their state, request identity, liveness, failed calls, the
  recorder, replay across attempts.
- ``backends/``: inference servers and the pool.
- ``render/``: chat templates and the token chain, messages, tool-call and reasoning parsers.
- ``core/``: what every layer uses: the internal request and response, the JSON codec.
"""
