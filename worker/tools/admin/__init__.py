"""Operator commands: ``topics create``, ``lag`` and ``dlq redrive``.

Registered on the main app by :func:`worker.tools.cli._register_admin`; the command modules
import Kafka only when a command runs, so ``trt-worker --help`` stays fast.
"""
