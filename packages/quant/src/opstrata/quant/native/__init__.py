"""quant's native C library: the exact int8 GEMM (``qgemm.c``), built on first use and loaded by ctypes."""
