"""Models to engine artifacts: specs, lazy loaders, and runners behind one interface.

``engines`` never imports ``worker``. GPU libraries (torch, tensorrt, cuda-python) are imported
only inside the backends that need them.
"""
