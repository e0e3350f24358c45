"""The AOTInductor backend: a model's native network compiled ahead of time, per static shape.

Built like a TensorRT plan (:mod:`.build`): ``torch.export`` plus
``torch._inductor.aoti_compile_and_package`` once per (batch size, item shape) of the static
profiles, verified against the float32 network, timed against the alternatives and bundled into
one cache artifact (:mod:`.bundle`) with the weights they share (:mod:`.weights`). Served
(:mod:`.runner`) with no compilation: torch's C++ package loader per shape, bound to the
weights read once (once per process where torch never releases them: :mod:`.kept`), a CUDA
graph over it where the build measured that faster.
torch is imported lazily, never by importing the package.
"""
