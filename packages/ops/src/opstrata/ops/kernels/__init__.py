"""Kernels, one module per op family, each registering its ``ref`` and ``cpu`` implementations (and decompositions) into the ops registry."""
