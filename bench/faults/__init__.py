"""Long fault-injection runs: kill -9, broker stalls, scaling, malformed floods, soak.

Each script runs the same scenario as its test in tests/integration/ (shared code in
tests/harness/faults/), longer, and writes a JSON record (parameters, commit, figures)
under bench/results/. Run from the repository root, e.g. ``python -m bench.faults.kill9``.
"""
