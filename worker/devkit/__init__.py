"""worker/devkit: the local Kafka launcher `trt-worker demo` starts (local_kafka). The test and
benchmark harness that drives it lives in tests/harness/, outside the installed package."""
