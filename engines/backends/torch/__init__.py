"""The torch backend: one runner (:mod:`.runner`) over one CUDA-graph slot type (:mod:`.graphs`)
for every model's native network, its artifact (:mod:`.artifact`: the weights in the engine
precision) and the three-stream pixel pipeline (:mod:`.pipeline`). A model's network comes in
through its spec (:class:`engines.spec.NativeNet`); this package imports no model, and torch is
imported lazily, never by importing the package.
"""
