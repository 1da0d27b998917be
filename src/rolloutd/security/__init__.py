"""Secrets out of the workflow history, and secured transport to Temporal.

- :mod:`rolloutd.security.codec`: the AES-GCM payload codec and its key ring;
- :mod:`rolloutd.security.connection`: the one Temporal client factory (converter, codec,
  failure converter, TLS/mTLS, API key) every rolloutd process uses;
- :mod:`rolloutd.security.codec_server`: ``rolloutd codec-server``, Temporal's remote codec
  protocol for the Temporal UI and CLI.
"""
