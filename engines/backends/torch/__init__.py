"""The torch backend: runners, CUDA-graph slots and the three-stream pixel pipeline."""
