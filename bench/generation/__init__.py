"""Text-to-image (SD 1.5 layout): the torch runner end to end, the UNet step on the compiled
engines, warm loads, and UNet kernels, rewrites and Inductor variants."""
