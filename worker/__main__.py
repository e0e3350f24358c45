"""`python -m worker` is the `trt-worker` command."""

from worker.cli import main

main()
