"""kafka-trt-worker: the Kafka-facing service (config, Kafka I/O, codec, batching, CLI).

GPU libraries are imported lazily inside the modules that need them, so this package imports
and tests on CPU-only machines.
"""

__version__ = "0.1.0"
