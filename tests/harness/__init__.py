"""Test and benchmark harness: worker processes, the fault drills and their corpus, a
request-delaying TCP proxy, conformance inputs. Shared by tests/ and bench/; kept out of the
installed package (only the local Kafka launcher, worker.devkit.local_kafka, ships, for
`trt-worker demo`), and nothing under worker/ or engines/ imports it."""
