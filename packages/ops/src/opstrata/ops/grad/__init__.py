"""Backward kernels (training): one module per forward family, registered beside the forward ops."""
