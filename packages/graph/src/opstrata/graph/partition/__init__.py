"""Tensor-parallel partitioning (Megatron-LM): the analysis, per-op layout rules, the collective hook and the in-process simulator."""
