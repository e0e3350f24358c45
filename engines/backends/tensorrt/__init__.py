"""TensorRT 10: builder (ONNX parser, optimization profiles, FP16/INT8/FP8, timing cache) and
runtime (execute_async_v3 on the caller's stream). ``tensorrt`` is imported lazily; the pure
parts (profile shapes, calibration batching) are importable and tested everywhere."""
