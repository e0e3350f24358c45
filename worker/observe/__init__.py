"""What an operator sees of a running worker: Prometheus metrics, health and readiness, traces.

Nothing here sits on the per-record path except the bucket counts the loop already keeps
(:class:`worker.observe.buckets.Buckets`): the metrics are read from the loop's own counters
when Prometheus scrapes (:mod:`worker.observe.collector`).
"""
