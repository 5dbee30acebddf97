"""The native C library: kernel source, the on-first-use build and loader, and the kernels it registers on ``cpu``."""
