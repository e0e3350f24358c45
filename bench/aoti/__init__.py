"""The compiled (AOTInductor) engines: builds, loads and per-shape timings."""
