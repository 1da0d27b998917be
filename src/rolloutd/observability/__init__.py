"""Observability: the metric names every fleet exports (:mod:`.names`), the prometheus-client
metrics of the gateway and the sandbox hosts (:mod:`.metrics`), and the Temporal SDK's
Prometheus exporter of a worker process with its metrics port (:mod:`.exporter`).

Names live in :mod:`.names`, which imports nothing, so workflow code can use them
(docs/metrics.md lists them all).
"""
