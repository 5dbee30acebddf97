"""The CUDA C++ source of the cuda device's kernels, compiled at run time by NVRTC (through CuPy).

Header-free (no CUDA toolkit needed, only NVRTC), IEEE math (no fast math), fp32 accumulation.
"""

from __future__ import annotations

#: Block size of the row kernels (softmax, layer_norm, rms_norm): one block per row.
ROW_THREADS = 256
#: Block size of the grid-stride elementwise kernels (bias_act).
ELEMENTWISE_THREADS = 256
#: Blocks at most in one elementwise launch; the grid-stride loop covers the rest.
ELEMENTWISE_MAX_BLOCKS = 65535

#: numpy dtype name -> kernel-name suffix; f16 and bf16 are stored as ``unsigned short`` bits.
DTYPE_SUFFIX: dict[str, str] = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}

#: Head dims the flash attention kernels are instantiated for.
FLASH_HEAD_DIMS = (64, 128)
#: The SIMT flash kernel: 4 warps; query rows per block by head dim; keys per shared-memory tile.
FLASH_THREADS = 128
FLASH_BLOCK_M: dict[int, int] = {64: 32, 128: 32}
FLASH_BLOCK_N = 32
#: The tensor-core (mma.sync m16n8k16) flash kernel, f16/bf16 only, sm_80 and newer: 4 warps of
#: 16 query rows each, 64 keys per tile.
FLASH_MMA_THREADS = 128
FLASH_MMA_BLOCK_M = 64
FLASH_MMA_BLOCK_N = 64
FLASH_MMA_DTYPES = ("float16", "bfloat16")
#: Lowest compute capability (major * 10 + minor) on which the mma kernels do work; compiled for an
#: older one their bodies are empty.
FLASH_MMA_MIN_CC = 80

KINDS = ("softmax", "layer_norm", "rms_norm", "bias_act", "flash_attn", "flash_attn_mma")
_ROW_KINDS = {
    "softmax": "opstrata_softmax_rows_{sfx}",
    "layer_norm": "opstrata_layer_norm_rows_{sfx}",
    "rms_norm": "opstrata_rms_norm_rows_{sfx}",
    "bias_act": "opstrata_bias_act_{sfx}",
}
#: ``act`` codes of bias_act.
ACTIVATIONS: dict[str, int] = {"identity": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}

_MAX_GRID_X = 2**31 - 1


def kernel_name(kind: str, dtype_name: str, head_dim: int | None = None) -> str:
    """The ``extern "C"`` name of a kernel in SOURCE, e.g. ``("softmax", "float16") -> "opstrata_softmax_rows_f16"``.

    ``head_dim`` is required by (and only by) the flash kinds; ``flash_attn_mma`` exists for float16
    and bfloat16 only.
    """
    if kind not in KINDS:
        raise ValueError(f"kernel_name: unknown kind {kind!r}; supported: {', '.join(KINDS)}")
    if dtype_name not in DTYPE_SUFFIX:
        raise ValueError(
            f"kernel_name: unsupported dtype {dtype_name!r}; supported: {', '.join(DTYPE_SUFFIX)}"
        )
    sfx = DTYPE_SUFFIX[dtype_name]
    if kind in _ROW_KINDS:
        if head_dim is not None:
            raise ValueError(f"kernel_name: {kind!r} takes no head_dim (got {head_dim!r})")
        return _ROW_KINDS[kind].format(sfx=sfx)
    if head_dim not in FLASH_HEAD_DIMS:
        dims = ", ".join(map(str, FLASH_HEAD_DIMS))
        raise ValueError(f"kernel_name: {kind!r} needs head_dim in ({dims}), got {head_dim!r}")
    if kind == "flash_attn_mma":
        if dtype_name not in FLASH_MMA_DTYPES:
            raise ValueError(
                f"kernel_name: 'flash_attn_mma' supports dtypes {', '.join(FLASH_MMA_DTYPES)}, got {dtype_name!r}"
            )
        return f"opstrata_flash_attn_mma_{sfx}_d{head_dim}"
    return f"opstrata_flash_attn_{sfx}_d{head_dim}"


def _dtype_of(kind_dtype: str) -> str:
    """The dtype name of `kind_dtype`: a dtype name, or a flash kernel name from kernel_name."""
    if kind_dtype in DTYPE_SUFFIX:
        return kind_dtype
    for dtype_name, sfx in DTYPE_SUFFIX.items():
        for dim in FLASH_HEAD_DIMS:
            if kind_dtype in (f"opstrata_flash_attn_{sfx}_d{dim}", f"opstrata_flash_attn_mma_{sfx}_d{dim}"):
                return dtype_name
    raise ValueError(
        f"flash_launch: expected a dtype name ({', '.join(DTYPE_SUFFIX)}) or a flash kernel name, got {kind_dtype!r}"
    )


def _check_dims(where: str, b: int, h: int, n: int, head_dim: int) -> None:
    if head_dim not in FLASH_HEAD_DIMS:
        dims = ", ".join(map(str, FLASH_HEAD_DIMS))
        raise ValueError(f"{where}: head_dim must be one of ({dims}), got {head_dim!r}")
    if min(b, h, n) < 1:
        raise ValueError(f"{where}: b, h, n must be >= 1, got b={b}, h={h}, n={n}")


def _grid(where: str, tiles: int, b: int, h: int) -> tuple[int, int, int]:
    blocks = tiles * b * h  # blockIdx.x = (b * H + h) * tiles + query tile
    if blocks > _MAX_GRID_X:
        raise ValueError(f"{where}: {blocks} blocks exceed the grid limit {_MAX_GRID_X}; split the batch")
    return (blocks, 1, 1)


def flash_launch(
    kind_dtype: str, b: int, h: int, n: int, head_dim: int
) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """(grid, block, dynamic shared bytes) of ``opstrata_flash_attn_<sfx>_d<head_dim>``.

    `kind_dtype` is the dtype name (or the kernel's name). One block per (query tile, b, h), flattened
    into grid.x (the kernel decodes it); all shared memory is static (< 48 KiB), so the dynamic bytes are 0.
    """
    _dtype_of(kind_dtype)
    _check_dims("flash_launch", b, h, n, head_dim)
    block_m = FLASH_BLOCK_M[head_dim]
    return _grid("flash_launch", -(-n // block_m), b, h), (FLASH_THREADS, 1, 1), 0


def flash_launch_mma(
    kind_dtype: str, b: int, h: int, n: int, head_dim: int
) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """(grid, block, dynamic shared bytes) of ``opstrata_flash_attn_mma_<sfx>_d<head_dim>`` (float16, bfloat16)."""
    if _dtype_of(kind_dtype) not in FLASH_MMA_DTYPES:
        raise ValueError(f"flash_launch_mma: supports {', '.join(FLASH_MMA_DTYPES)}, got {kind_dtype!r}")
    _check_dims("flash_launch_mma", b, h, n, head_dim)
    return _grid("flash_launch_mma", -(-n // FLASH_MMA_BLOCK_M), b, h), (FLASH_MMA_THREADS, 1, 1), 0


def flash_static_shared_bytes(head_dim: int, *, mma: bool = False) -> int:
    """Static shared memory of a flash kernel (what the kernel declares; for tests and reports)."""
    if mma:
        return 2 * FLASH_MMA_BLOCK_N * (head_dim + 8) * 2  # K and V tiles, u16, rows padded by 8
    return (2 * FLASH_BLOCK_N * head_dim + (FLASH_THREADS // 32) * FLASH_BLOCK_N) * 4  # K, V, P in fp32


def elementwise_launch(n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) for bias_act over `n` elements (grid-stride: the grid is capped)."""
    blocks = max(1, min(-(-n // ELEMENTWISE_THREADS), ELEMENTWISE_MAX_BLOCKS))
    return (blocks, 1, 1), (ELEMENTWISE_THREADS, 1, 1)


def compile_options(arch: str) -> tuple[str, ...]:
    """NVRTC options for `arch` (e.g. ``"sm_90"``): C++17, IEEE math (no --use_fast_math)."""
    return ("-std=c++17", f"--gpu-architecture={arch}")


_PRELUDE = f"""\
#define OPS_ROW_THREADS {ROW_THREADS}
#define OPS_FLASH_THREADS {FLASH_THREADS}
#define OPS_FLASH_WARPS {FLASH_THREADS // 32}
#define OPS_FLASH_BLOCK_N {FLASH_BLOCK_N}
#define OPS_FLASH_BLOCK_M_D64 {FLASH_BLOCK_M[64]}
#define OPS_FLASH_BLOCK_M_D128 {FLASH_BLOCK_M[128]}
#define OPS_MMA_THREADS {FLASH_MMA_THREADS}
#define OPS_MMA_BLOCK_M {FLASH_MMA_BLOCK_M}
#define OPS_MMA_BLOCK_N {FLASH_MMA_BLOCK_N}
#define OPS_MMA_MIN_ARCH {FLASH_MMA_MIN_CC * 10}
"""

_BODY = r"""
// ============================================================================ storage types
// f32 is float; f16 and bf16 are unsigned short holding the IEEE binary16 / bfloat16 bits.
// All arithmetic is fp32; each stored value is rounded once (round to nearest even).
typedef unsigned short u16;

#define OPS_FULL_MASK 0xffffffffu
#define OPS_NEG_INF __uint_as_float(0xff800000u)
#define OPS_POS_INF __uint_as_float(0x7f800000u)
#define OPS_NAN __uint_as_float(0x7fc00000u)

static __device__ __forceinline__ float f16_to_float(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

static __device__ __forceinline__ u16 float_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

static __device__ __forceinline__ float bf16_to_float(u16 b) {
    return __uint_as_float(((unsigned)b) << 16);
}

static __device__ __forceinline__ u16 float_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x0040u);  // NaN stays NaN (quiet bit set, sign kept)
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow rounds to inf
    return (u16)(u >> 16);
}

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float to_float(float v) { return v; }
    static __device__ __forceinline__ float from_float(float v) { return v; }
};

struct F16 {
    typedef u16 T;
    static __device__ __forceinline__ float to_float(u16 v) { return f16_to_float(v); }
    static __device__ __forceinline__ u16 from_float(float v) { return float_to_f16(v); }
};

struct BF16 {
    typedef u16 T;
    static __device__ __forceinline__ float to_float(u16 v) { return bf16_to_float(v); }
    static __device__ __forceinline__ u16 from_float(float v) { return float_to_bf16(v); }
};

// ============================================================================ reductions

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(OPS_FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(OPS_FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
static __device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float result;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = lane < nwarps ? part[lane] : 0.0f;
        w = warp_sum(w);
        if (lane == 0) result = w;
    }
    __syncthreads();
    return result;
}

// Online softmax state: m the max of the finite entries seen, s = sum(exp(x - m)) over them.
static __device__ __forceinline__ void softmax_merge(float& m, float& s, float mo, float so) {
    const float mn = fmaxf(m, mo);  // m and mo are never NaN
    const float a = s == 0.0f ? 0.0f : s * expf(m - mn);
    const float b = so == 0.0f ? 0.0f : so * expf(mo - mn);
    s = a + b;
    m = mn;
}

// Welford state (count, mean, M2) merged with Chan's formula.
static __device__ __forceinline__ void welford_merge(float& n, float& mean, float& m2, float nb, float mb,
                                                     float m2b) {
    if (nb > 0.0f) {
        const float nn = n + nb;
        const float delta = mb - mean;
        const float w = nb / nn;
        mean = mean + delta * w;
        m2 = m2 + m2b + delta * delta * n * w;
        n = nn;
    }
}

// ============================================================================ softmax / log_softmax
// softmax = exp(x - m) / sum(exp(x - m)), m the row max; log_softmax = x - m - log(sum).
// An all -inf row gives zeros (softmax) / -inf (log_softmax); a +inf or NaN entry makes the row NaN.
// One pass computes (max, sum) online over the finite entries, a second pass writes.
// In-place (y == x) is safe: every read of the row happens before the barrier that precedes the writes.

template <class IO>
static __device__ __forceinline__ void softmax_rows(const typename IO::T* x, typename IO::T* y, int rows,
                                                    int cols, int log_softmax) {
    __shared__ float part_m[32], part_s[32];
    __shared__ int part_bad[32];
    __shared__ float res_m, res_s;
    __shared__ int res_bad;
    const int row = blockIdx.x;
    if (row >= rows) return;
    const typename IO::T* xr = x + (long long)row * cols;
    typename IO::T* yr = y + (long long)row * cols;
    float m = OPS_NEG_INF, s = 0.0f;
    int bad = 0;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = IO::to_float(xr[j]);
        if (v == OPS_NEG_INF) continue;  // probability 0
        if (!(v < OPS_POS_INF)) {        // NaN or +inf
            bad = 1;
            continue;
        }
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(OPS_FULL_MASK, m, o);
        const float so = __shfl_xor_sync(OPS_FULL_MASK, s, o);
        bad |= __shfl_xor_sync(OPS_FULL_MASK, bad, o);
        softmax_merge(m, s, mo, so);
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_s[warp] = s;
        part_bad[warp] = bad;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < nwarps ? part_m[lane] : OPS_NEG_INF;
        s = lane < nwarps ? part_s[lane] : 0.0f;
        bad = lane < nwarps ? part_bad[lane] : 0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float mo = __shfl_xor_sync(OPS_FULL_MASK, m, o);
            const float so = __shfl_xor_sync(OPS_FULL_MASK, s, o);
            bad |= __shfl_xor_sync(OPS_FULL_MASK, bad, o);
            softmax_merge(m, s, mo, so);
        }
        if (lane == 0) {
            res_m = m;
            res_s = s;
            res_bad = bad;
        }
    }
    __syncthreads();
    m = res_m;
    s = res_s;
    bad = res_bad;
    const bool empty = m == OPS_NEG_INF;  // every entry -inf
    const float log_s = empty ? 0.0f : logf(s);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        const float v = IO::to_float(xr[j]);
        float out;
        if (bad) {
            out = OPS_NAN;
        } else if (log_softmax) {
            out = empty ? OPS_NEG_INF : (v - m) - log_s;
        } else {
            out = empty ? 0.0f : expf(v - m) / s;
        }
        yr[j] = IO::from_float(out);
    }
}

// ============================================================================ layer_norm
// s = x + residual (fp32, not rounded); y = (s - mean) * (1 / sqrt(var + eps)) * weight + bias with the
// population variance; sum_out = s rounded. residual, weight, bias, sum_out may be NULL.
// Per-thread Welford merged with Chan's formula; the second pass re-reads x (and residual), so any
// element-wise aliasing among x, residual, y and sum_out is safe.

template <class IO>
static __device__ __forceinline__ void layer_norm_rows(const typename IO::T* x, const typename IO::T* residual,
                                                       const typename IO::T* weight, const typename IO::T* bias,
                                                       typename IO::T* y, typename IO::T* sum_out, int rows,
                                                       int cols, float eps) {
    __shared__ float part_n[32], part_mean[32], part_m2[32];
    __shared__ float res_mean, res_m2;
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = IO::to_float(x[base + j]);
        if (residual) v += IO::to_float(residual[base + j]);
        n += 1.0f;
        const float d = v - mean;
        mean += d / n;
        m2 += d * (v - mean);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float nb = __shfl_xor_sync(OPS_FULL_MASK, n, o);
        const float mb = __shfl_xor_sync(OPS_FULL_MASK, mean, o);
        const float m2b = __shfl_xor_sync(OPS_FULL_MASK, m2, o);
        welford_merge(n, mean, m2, nb, mb, m2b);
    }
    if (lane == 0) {
        part_n[warp] = n;
        part_mean[warp] = mean;
        part_m2[warp] = m2;
    }
    __syncthreads();
    if (warp == 0) {
        n = lane < nwarps ? part_n[lane] : 0.0f;
        mean = lane < nwarps ? part_mean[lane] : 0.0f;
        m2 = lane < nwarps ? part_m2[lane] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float nb = __shfl_xor_sync(OPS_FULL_MASK, n, o);
            const float mb = __shfl_xor_sync(OPS_FULL_MASK, mean, o);
            const float m2b = __shfl_xor_sync(OPS_FULL_MASK, m2, o);
            welford_merge(n, mean, m2, nb, mb, m2b);
        }
        if (lane == 0) {
            res_mean = mean;
            res_m2 = m2;
        }
    }
    __syncthreads();
    mean = res_mean;
    const float var = res_m2 / (float)cols;
    const float inv = 1.0f / sqrtf(var + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = IO::to_float(x[base + j]);
        if (residual) v += IO::to_float(residual[base + j]);
        float out = (v - mean) * inv;
        if (weight) out = out * IO::to_float(weight[j]);
        if (bias) out = out + IO::to_float(bias[j]);
        y[base + j] = IO::from_float(out);
        if (sum_out) sum_out[base + j] = IO::from_float(v);
    }
}

// ============================================================================ rms_norm
// s = x + residual; y = s / sqrt(mean(s * s) + eps) * weight; sum_out = s rounded; nullables as above.

template <class IO>
static __device__ __forceinline__ void rms_norm_rows(const typename IO::T* x, const typename IO::T* residual,
                                                     const typename IO::T* weight, typename IO::T* y,
                                                     typename IO::T* sum_out, int rows, int cols, float eps) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    const long long base = (long long)row * cols;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = IO::to_float(x[base + j]);
        if (residual) v += IO::to_float(residual[base + j]);
        ss += v * v;
    }
    ss = block_sum(ss);
    const float r = sqrtf(ss / (float)cols + eps);
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float v = IO::to_float(x[base + j]);
        if (residual) v += IO::to_float(residual[base + j]);
        float out = v / r;
        if (weight) out = out * IO::to_float(weight[j]);
        y[base + j] = IO::from_float(out);
        if (sum_out) sum_out[base + j] = IO::from_float(v);
    }
}

// ============================================================================ bias + activation
// t = x + bias[i % cols]; act 0 identity, 1 relu, 2 gelu (erf), 3 gelu (tanh), 4 silu; then + residual.
// Grid-stride over n elements; each element is read before it is written, so y may alias x.

template <class IO>
static __device__ __forceinline__ void bias_act(const typename IO::T* x, const typename IO::T* bias,
                                                const typename IO::T* residual, typename IO::T* y, long long n,
                                                int cols, int act) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float t = IO::to_float(x[i]);
        if (bias) t += IO::to_float(bias[i % cols]);
        switch (act) {
            case 1:
                t = t < 0.0f ? 0.0f : t;  // NaN stays NaN
                break;
            case 2:
                t = 0.5f * t * (1.0f + erff(t * 0.70710678118654752f));
                break;
            case 3:
                t = 0.5f * t * (1.0f + tanhf(0.7978845608028654f * (t + 0.044715f * t * t * t)));
                break;
            case 4:
                t = t / (1.0f + expf(-t));
                break;
            default:
                break;
        }
        if (residual) t += IO::to_float(residual[i]);
        y[i] = IO::from_float(t);
    }
}

// ============================================================================ flash attention (SIMT)
// q, o: [B, H, N, D]; k, v: [B, Hkv, M, D]; lse: [B, H, N] fp32 or NULL. Query head h reads kv head
// h / (H / Hkv). Causal is aligned bottom-right: query i sees keys j <= i + M - N. A row with no visible
// key gives o = 0 and lse = -inf. lse = m + log(l) in units of the scaled scores.
//
// FlashAttention-2 structure, fp32 FMAs. Block = 4 warps, BM query rows (BM / 4 per warp), grid.x =
// (b * H + h) * ceil(N / BM) + query tile. Key tiles of BN = 32 keys: K and V staged in shared memory
// as fp32 (2 * 32 * D * 4 bytes) plus 32 probabilities per warp. Per query row, a warp:
//   1. each lane holds D / 32 query dims (q[lane + 32 t]) and computes partial dot products with all
//      32 keys of the tile (Ks[j][lane + 32 t]: consecutive lanes, consecutive banks);
//   2. a butterfly "transpose-reduce" (16 + 8 + 4 + 2 + 1 = 31 shuffles) leaves lane j with the full
//      score of key j;
//   3. online softmax: m_new = max(m, tile max), acc *= exp(m - m_new), p = exp(s - m_new),
//      l = l * exp(m - m_new) + sum(p) (warp shuffles);
//   4. acc[lane + 32 t] += sum_j p_j * V[j][lane + 32 t], p_j broadcast from shared memory.
// Key tiles beyond the last key visible to the block's last query row are never loaded (causal block
// skipping); within a tile, rows that see none of its keys skip it.

#define OPS_TR_STEP(W)                                                         \
    {                                                                          \
        const bool upper = (lane & (W)) != 0;                                  \
        _Pragma("unroll") for (int i = 0; i < (W); ++i) {                      \
            const float send = upper ? part[i] : part[i + (W)];                \
            const float keep = upper ? part[i + (W)] : part[i];                \
            part[i] = keep + __shfl_xor_sync(OPS_FULL_MASK, send, (W));        \
        }                                                                      \
    }

template <class IO, int D, int BM>
static __device__ __forceinline__ void flash_attn_simt(const typename IO::T* q, const typename IO::T* k,
                                                       const typename IO::T* v, typename IO::T* o, float* lse,
                                                       int B, int H, int Hkv, int N, int M, float scale,
                                                       int causal) {
    constexpr int BN = OPS_FLASH_BLOCK_N;
    constexpr int WARPS = OPS_FLASH_WARPS;
    constexpr int RPW = BM / WARPS;  // query rows per warp
    constexpr int DT = D / 32;       // dims per lane
    static_assert(BN == 32, "one key per lane");
    static_assert(D % 32 == 0 && BM % WARPS == 0, "tile shape");
    __shared__ float Ks[BN][D];
    __shared__ float Vs[BN][D];
    __shared__ float Ps[WARPS][BN];

    const int tiles = (N + BM - 1) / BM;
    const long long bh = (long long)blockIdx.x / tiles;
    const int tile = (int)((long long)blockIdx.x - bh * tiles);
    const int b = (int)(bh / H), h = (int)(bh - (long long)b * H);
    if (b >= B) return;
    const int hk = h / (H / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q0 = tile * BM;
    const int row0 = q0 + warp * RPW;
    const long long qrow_base = ((long long)b * H + h) * N;  // row index of (b, h, 0)
    const long long krow_base = ((long long)b * Hkv + hk) * M;
    const int off = M - N;  // causal: query i sees keys j <= i + off

    float qr[RPW][DT], acc[RPW][DT], mr[RPW], lr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        const int row = row0 + r;
#pragma unroll
        for (int t = 0; t < DT; ++t) {
            qr[r][t] = row < N ? IO::to_float(q[(qrow_base + row) * D + lane + 32 * t]) : 0.0f;
            acc[r][t] = 0.0f;
        }
        mr[r] = OPS_NEG_INF;
        lr[r] = 0.0f;
    }

    // keys [0, kv_end) can be visible to some row of this block
    int kv_end = M;
    if (causal) {
        const long long last = (long long)min(q0 + BM, N) - 1 + off;
        kv_end = (int)min((long long)M, last + 1);
    }
    for (int k0 = 0; k0 < kv_end; k0 += BN) {
        __syncthreads();  // the previous tile is consumed
        for (int e = threadIdx.x; e < BN * D; e += OPS_FLASH_THREADS) {
            const int j = e / D, d = e - (e / D) * D;
            const int key = k0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (key < M) {
                const long long g = (krow_base + key) * D + d;
                kv = IO::to_float(k[g]);
                vv = IO::to_float(v[g]);
            }
            Ks[j][d] = kv;
            Vs[j][d] = vv;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < RPW; ++r) {
            const int row = row0 + r;
            if (row >= N) continue;  // warp-uniform
            const int last_key = causal ? row + off : M - 1;
            if (k0 > last_key) continue;  // warp-uniform: no key of this tile is visible to the row
            float part[BN];
#pragma unroll
            for (int j = 0; j < BN; ++j) {
                float a = 0.0f;
#pragma unroll
                for (int t = 0; t < DT; ++t) a = fmaf(qr[r][t], Ks[j][lane + 32 * t], a);
                part[j] = a;
            }
            OPS_TR_STEP(16)
            OPS_TR_STEP(8)
            OPS_TR_STEP(4)
            OPS_TR_STEP(2)
            OPS_TR_STEP(1)
            const int key = k0 + lane;
            const bool visible = key < M && key <= last_key;
            const float sc = visible ? part[0] * scale : OPS_NEG_INF;
            const float m_new = fmaxf(mr[r], warp_max(sc));
            const float m_safe = m_new == OPS_NEG_INF ? 0.0f : m_new;
            const float alpha = expf(mr[r] - m_safe);  // 0 while nothing was seen
            const float p = expf(sc - m_safe);         // 0 for invisible keys
            lr[r] = lr[r] * alpha + warp_sum(p);
            mr[r] = m_new;
#pragma unroll
            for (int t = 0; t < DT; ++t) acc[r][t] *= alpha;
            Ps[warp][lane] = p;
            __syncwarp();
#pragma unroll 8
            for (int j = 0; j < BN; ++j) {
                const float pj = Ps[warp][j];
#pragma unroll
                for (int t = 0; t < DT; ++t) acc[r][t] = fmaf(pj, Vs[j][lane + 32 * t], acc[r][t]);
            }
            __syncwarp();
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        const int row = row0 + r;
        if (row >= N) continue;
        const float l = lr[r];
#pragma unroll
        for (int t = 0; t < DT; ++t) {
            o[(qrow_base + row) * D + lane + 32 * t] = IO::from_float(l == 0.0f ? 0.0f : acc[r][t] / l);
        }
        if (lse != nullptr && lane == 0) lse[qrow_base + row] = l == 0.0f ? OPS_NEG_INF : mr[r] + logf(l);
    }
}

// ============================================================================ flash attention (mma.sync)
// Same semantics as the SIMT kernel, f16 / bf16, tensor cores through inline PTX
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (sm_80+; compiled for an older arch the
// body is empty and the Python side must not launch it).
//
// Fragment layouts assumed (PTX ISA, "Matrix Fragments for mma.m16n8k16" with .f16/.bf16), with
// g = lane >> 2 (groupID) and c = lane & 3 (threadID_in_group); every .b32 register packs two 16-bit
// elements, the lower column/row index in the low 16 bits:
//   A (16 x 16, row-major, 4 regs): a0 = A[g][2c, 2c+1]     a1 = A[g+8][2c, 2c+1]
//                                   a2 = A[g][2c+8, 2c+9]   a3 = A[g+8][2c+8, 2c+9]
//   B (16 x 8, "col", 2 regs):      b0 = B[2c, 2c+1][g]      b1 = B[2c+8, 2c+9][g]
//   C/D (16 x 8, fp32, 4 regs):     d0, d1 = C[g][2c, 2c+1]  d2, d3 = C[g+8][2c, 2c+1]
// Block = 4 warps, each owning 16 query rows (BM = 64); key tiles of BN = 64 keys. K and V tiles are
// stored row-major [key][dim] as u16 with rows padded to D + 8 elements (fewer bank conflicts).
//   S = Q K^T: A = Q rows (registers, loaded once), B[k = dim][n = key] = K[key][dim]: b0 is the two
//     consecutive dims 2c, 2c+1 of key g of the n-block.
//   Online softmax on the S accumulators: thread holds rows g (d0, d1) and g + 8 (d2, d3); row max and
//     sum are reduced over the 4 threads of a group (shfl_xor 1, 2).
//   O += P V: the S accumulators of n-blocks 2kk and 2kk+1 are exactly the A fragment of key chunk kk
//     (a0 = S[2kk].d0,d1; a1 = S[2kk].d2,d3; a2 = S[2kk+1].d0,d1; a3 = S[2kk+1].d2,d3), rounded to
//     f16/bf16; B[k = key][n = dim] = V[key][dim]: b0 = V[2c][g], V[2c+1][g] (two 16-bit loads).

#if __CUDA_ARCH__ >= OPS_MMA_MIN_ARCH
static __device__ __forceinline__ void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1, F16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ void mma_16816(float* d, const unsigned* a, unsigned b0, unsigned b1, BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ unsigned pack2(u16 lo, u16 hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}
#endif

template <class IO, int D>
static __device__ __forceinline__ void flash_attn_mma(const u16* q, const u16* k, const u16* v, u16* o,
                                                      float* lse, int B, int H, int Hkv, int N, int M,
                                                      float scale, int causal) {
#if __CUDA_ARCH__ >= OPS_MMA_MIN_ARCH
    constexpr int BM = OPS_MMA_BLOCK_M, BN = OPS_MMA_BLOCK_N;
    constexpr int LDS = D + 8;  // shared row stride in elements
    constexpr int KC = D / 16;  // k-chunks of S = Q K^T
    constexpr int NB = BN / 8;  // n-blocks of S
    constexpr int DB = D / 8;   // n-blocks of O
    static_assert(BM == 4 * 16 && BN % 16 == 0 && D % 16 == 0, "tile shape");
    __shared__ __align__(16) u16 Ks[BN * LDS];
    __shared__ __align__(16) u16 Vs[BN * LDS];

    const int tiles = (N + BM - 1) / BM;
    const long long bh = (long long)blockIdx.x / tiles;
    const int tile = (int)((long long)blockIdx.x - bh * tiles);
    const int b = (int)(bh / H), h = (int)(bh - (long long)b * H);
    if (b >= B) return;
    const int hk = h / (H / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int q0 = tile * BM;
    const int wrow0 = q0 + warp * 16;       // first query row of this warp
    const int r_lo = wrow0 + g, r_hi = r_lo + 8;
    const long long qrow_base = ((long long)b * H + h) * N;
    const long long krow_base = ((long long)b * Hkv + hk) * M;
    const int off = M - N;

    // Q fragments (A of S = Q K^T), zero for rows >= N
    unsigned qa[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; ++kc) {
        const int col = kc * 16 + 2 * c;
        const u16* plo = q + (qrow_base + r_lo) * D + col;
        const u16* phi = q + (qrow_base + r_hi) * D + col;
        const bool lo_ok = r_lo < N, hi_ok = r_hi < N;
        qa[kc][0] = lo_ok ? pack2(plo[0], plo[1]) : 0u;
        qa[kc][1] = hi_ok ? pack2(phi[0], phi[1]) : 0u;
        qa[kc][2] = lo_ok ? pack2(plo[8], plo[9]) : 0u;
        qa[kc][3] = hi_ok ? pack2(phi[8], phi[9]) : 0u;
    }
    float oacc[DB][4];
#pragma unroll
    for (int db = 0; db < DB; ++db) oacc[db][0] = oacc[db][1] = oacc[db][2] = oacc[db][3] = 0.0f;
    float m_lo = OPS_NEG_INF, m_hi = OPS_NEG_INF, l_lo = 0.0f, l_hi = 0.0f;  // l: this thread's partial sums

    int kv_end = M;
    if (causal) {
        const long long last = (long long)min(q0 + BM, N) - 1 + off;
        kv_end = (int)min((long long)M, last + 1);
    }
    // last key visible to any valid row of this warp (warp-uniform)
    const int warp_last_row = min(wrow0 + 15, N - 1);
    const int warp_last_key = causal ? warp_last_row + off : M - 1;

    for (int k0 = 0; k0 < kv_end; k0 += BN) {
        __syncthreads();
        for (int e = threadIdx.x; e < BN * D; e += OPS_MMA_THREADS) {
            const int j = e / D, d = e - (e / D) * D;
            const int key = k0 + j;
            u16 kv = 0, vv = 0;
            if (key < M) {
                const long long gi = (krow_base + key) * D + d;
                kv = k[gi];
                vv = v[gi];
            }
            Ks[j * LDS + d] = kv;
            Vs[j * LDS + d] = vv;
        }
        __syncthreads();
        if (wrow0 >= N || k0 > warp_last_key) continue;  // warp-uniform

        float s[NB][4];
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
                const u16* kp = Ks + (nb * 8 + g) * LDS + kc * 16 + 2 * c;
                mma_16816(s[nb], qa[kc], pack2(kp[0], kp[1]), pack2(kp[8], kp[9]), IO());
            }
        }
        // scale and mask; row maxima
        float mx_lo = OPS_NEG_INF, mx_hi = OPS_NEG_INF;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + nb * 8 + 2 * c + (e & 1);
                const int row = e < 2 ? r_lo : r_hi;
                const bool visible = key < M && (!causal || key <= row + off);
                s[nb][e] = visible ? s[nb][e] * scale : OPS_NEG_INF;
            }
            mx_lo = fmaxf(mx_lo, fmaxf(s[nb][0], s[nb][1]));
            mx_hi = fmaxf(mx_hi, fmaxf(s[nb][2], s[nb][3]));
        }
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(OPS_FULL_MASK, mx_lo, 1));
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(OPS_FULL_MASK, mx_lo, 2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(OPS_FULL_MASK, mx_hi, 1));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(OPS_FULL_MASK, mx_hi, 2));
        const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
        const float ms_lo = mn_lo == OPS_NEG_INF ? 0.0f : mn_lo;
        const float ms_hi = mn_hi == OPS_NEG_INF ? 0.0f : mn_hi;
        const float alpha_lo = expf(m_lo - ms_lo), alpha_hi = expf(m_hi - ms_hi);
        m_lo = mn_lo;
        m_hi = mn_hi;
        float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            s[nb][0] = expf(s[nb][0] - ms_lo);
            s[nb][1] = expf(s[nb][1] - ms_lo);
            s[nb][2] = expf(s[nb][2] - ms_hi);
            s[nb][3] = expf(s[nb][3] - ms_hi);
            sum_lo += s[nb][0] + s[nb][1];
            sum_hi += s[nb][2] + s[nb][3];
        }
        l_lo = l_lo * alpha_lo + sum_lo;
        l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
        for (int db = 0; db < DB; ++db) {
            oacc[db][0] *= alpha_lo;
            oacc[db][1] *= alpha_lo;
            oacc[db][2] *= alpha_hi;
            oacc[db][3] *= alpha_hi;
        }
        // O += P V
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned pa[4];
            pa[0] = pack2(IO::from_float(s[2 * kk][0]), IO::from_float(s[2 * kk][1]));
            pa[1] = pack2(IO::from_float(s[2 * kk][2]), IO::from_float(s[2 * kk][3]));
            pa[2] = pack2(IO::from_float(s[2 * kk + 1][0]), IO::from_float(s[2 * kk + 1][1]));
            pa[3] = pack2(IO::from_float(s[2 * kk + 1][2]), IO::from_float(s[2 * kk + 1][3]));
            const u16* vp = Vs + (kk * 16 + 2 * c) * LDS + g;
#pragma unroll
            for (int db = 0; db < DB; ++db) {
                const u16* p = vp + db * 8;
                mma_16816(oacc[db], pa, pack2(p[0], p[LDS]), pack2(p[8 * LDS], p[9 * LDS]), IO());
            }
        }
    }
    l_lo += __shfl_xor_sync(OPS_FULL_MASK, l_lo, 1);
    l_lo += __shfl_xor_sync(OPS_FULL_MASK, l_lo, 2);
    l_hi += __shfl_xor_sync(OPS_FULL_MASK, l_hi, 1);
    l_hi += __shfl_xor_sync(OPS_FULL_MASK, l_hi, 2);
#pragma unroll
    for (int db = 0; db < DB; ++db) {
        const int col = db * 8 + 2 * c;
        if (r_lo < N) {
            u16* p = o + (qrow_base + r_lo) * D + col;
            p[0] = IO::from_float(l_lo == 0.0f ? 0.0f : oacc[db][0] / l_lo);
            p[1] = IO::from_float(l_lo == 0.0f ? 0.0f : oacc[db][1] / l_lo);
        }
        if (r_hi < N) {
            u16* p = o + (qrow_base + r_hi) * D + col;
            p[0] = IO::from_float(l_hi == 0.0f ? 0.0f : oacc[db][2] / l_hi);
            p[1] = IO::from_float(l_hi == 0.0f ? 0.0f : oacc[db][3] / l_hi);
        }
    }
    if (lse != nullptr && c == 0) {
        if (r_lo < N) lse[qrow_base + r_lo] = l_lo == 0.0f ? OPS_NEG_INF : m_lo + logf(l_lo);
        if (r_hi < N) lse[qrow_base + r_hi] = l_hi == 0.0f ? OPS_NEG_INF : m_hi + logf(l_hi);
    }
#endif
}

// ============================================================================ extern "C" entry points

#define OPS_ROW_KERNELS(SFX, IO)                                                                           \
    extern "C" __global__ void __launch_bounds__(OPS_ROW_THREADS)                                          \
        opstrata_softmax_rows_##SFX(const IO::T* x, IO::T* y, int rows, int cols, int log_softmax) {       \
        softmax_rows<IO>(x, y, rows, cols, log_softmax);                                                   \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(OPS_ROW_THREADS) opstrata_layer_norm_rows_##SFX(          \
        const IO::T* x, const IO::T* residual, const IO::T* weight, const IO::T* bias, IO::T* y,           \
        IO::T* sum_out, int rows, int cols, float eps) {                                                   \
        layer_norm_rows<IO>(x, residual, weight, bias, y, sum_out, rows, cols, eps);                       \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(OPS_ROW_THREADS) opstrata_rms_norm_rows_##SFX(            \
        const IO::T* x, const IO::T* residual, const IO::T* weight, IO::T* y, IO::T* sum_out, int rows,    \
        int cols, float eps) {                                                                             \
        rms_norm_rows<IO>(x, residual, weight, y, sum_out, rows, cols, eps);                               \
    }                                                                                                      \
    extern "C" __global__ void opstrata_bias_act_##SFX(const IO::T* x, const IO::T* bias,                  \
                                                       const IO::T* residual, IO::T* y, long long n,       \
                                                       int cols, int act) {                                \
        bias_act<IO>(x, bias, residual, y, n, cols, act);                                                  \
    }

#define OPS_FLASH_KERNEL(SFX, IO, D, BM)                                                                   \
    extern "C" __global__ void __launch_bounds__(OPS_FLASH_THREADS) opstrata_flash_attn_##SFX##_d##D(      \
        const IO::T* q, const IO::T* k, const IO::T* v, IO::T* o, float* lse, int B, int H, int Hkv,       \
        int N, int M, float scale, int causal) {                                                           \
        flash_attn_simt<IO, D, BM>(q, k, v, o, lse, B, H, Hkv, N, M, scale, causal);                       \
    }

#define OPS_FLASH_MMA_KERNEL(SFX, IO, D)                                                                   \
    extern "C" __global__ void __launch_bounds__(OPS_MMA_THREADS) opstrata_flash_attn_mma_##SFX##_d##D(    \
        const u16* q, const u16* k, const u16* v, u16* o, float* lse, int B, int H, int Hkv, int N, int M, \
        float scale, int causal) {                                                                         \
        flash_attn_mma<IO, D>(q, k, v, o, lse, B, H, Hkv, N, M, scale, causal);                            \
    }

OPS_ROW_KERNELS(f32, F32)
OPS_ROW_KERNELS(f16, F16)
OPS_ROW_KERNELS(bf16, BF16)

OPS_FLASH_KERNEL(f32, F32, 64, OPS_FLASH_BLOCK_M_D64)
OPS_FLASH_KERNEL(f32, F32, 128, OPS_FLASH_BLOCK_M_D128)
OPS_FLASH_KERNEL(f16, F16, 64, OPS_FLASH_BLOCK_M_D64)
OPS_FLASH_KERNEL(f16, F16, 128, OPS_FLASH_BLOCK_M_D128)
OPS_FLASH_KERNEL(bf16, BF16, 64, OPS_FLASH_BLOCK_M_D64)
OPS_FLASH_KERNEL(bf16, BF16, 128, OPS_FLASH_BLOCK_M_D128)

OPS_FLASH_MMA_KERNEL(f16, F16, 64)
OPS_FLASH_MMA_KERNEL(f16, F16, 128)
OPS_FLASH_MMA_KERNEL(bf16, BF16, 64)
OPS_FLASH_MMA_KERNEL(bf16, BF16, 128)
"""

#: The one translation unit holding every kernel (compile with compile_options(arch) or CuPy's defaults).
SOURCE: str = _PRELUDE + _BODY

#: Every ``extern "C" __global__`` name in SOURCE.
KERNEL_NAMES: tuple[str, ...] = (
    *(kernel_name(kind, dtype) for kind in _ROW_KINDS for dtype in DTYPE_SUFFIX),
    *(kernel_name("flash_attn", dtype, dim) for dtype in DTYPE_SUFFIX for dim in FLASH_HEAD_DIMS),
    *(kernel_name("flash_attn_mma", dtype, dim) for dtype in FLASH_MMA_DTYPES for dim in FLASH_HEAD_DIMS),
)
