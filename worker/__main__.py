"""`python -m worker` is the `trt-worker` command."""

from worker.tools.cli import main

main()
