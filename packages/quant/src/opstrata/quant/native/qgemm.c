/* opstrata-quant: exact int8 GEMM (u8/s8 x s8/u8 -> int32) with fused epilogues.

   Compiled on first use by opstrata.quant.native (through opstrata.ops.build_library) WITHOUT
   -march=native: the vector code paths carry per-function target attributes and are chosen at run time
   with __builtin_cpu_supports, so one build runs on any x86-64 (and the portable path on anything).

   Paths (QG_PATH_*):
     amx         AMX-INT8 tdpbusd (16 x 16 x 64 MACs per instruction) on 32 x 32 / 16 x 64 blocks, reading the
                 packed panels in place; the rows after the last 16 on the avx512vnni kernel
     avx512vnni  vpdpbusd on zmm (64 u8*s8 MACs per instruction), 6 rows x 64 columns per micro-tile
     avxvnni     vpdpbusd on ymm: the VEX form (AVX-VNNI) or, where only AVX-512 VNNI exists, the EVEX
                 form of the same 256-bit kernel (so the code is exercised on both kinds of CPU)
     avx2        exact widening path: bytes sign/zero-extended to int16 and multiplied with
                 vpmaddwd (int16 pairs -> int32); vpmaddubsw is NOT used: it saturates to int16
     portable    plain C (B widened to int16 per k-group; compilers vectorize the row loops)
   All accumulate modulo 2^32 (the ONNX int32 result of an int64 sum, wrapped), so every path is
   bit-identical to an int64 reference cast to int32.

   Math. A (M x K, u8 or s8, zero point za per tensor or per row), B (K x N, s8 or u8, zero point zb per
   tensor or per column). The kernels multiply Au = A as u8 (s8 is shifted by +128) with Bs = B as s8
   (u8 is shifted by -128):
       sum_k (A - za)(B - zb) = sum_k (Au - za')(Bs - zb')      za' = za + 128*a_signed,
                                                                 zb' = zb - 128*b_unsigned
                              = dot(Au, Bs) - za' colsum(Bs) - zb' (rowsum(Au) - K za')
   B is packed once (opstrata_qgemm_pack_b): panels of 64 columns, K in groups of 4 bytes (the vpdpbusd
   layout: for each k-group, 64 columns x 4 consecutive k), zero padded in K (to 64) and N, with colsum(Bs) and
   zb'. opstrata_qgemm splits rows (or panels, when rows are few) over pthreads and applies the
   epilogue (int32, float32 dequantize + bias + ReLU, or int8/uint8 requantize) per micro-tile.
   opstrata_qgemm_fingerprint hashes a weight's bytes so a caller can tell an unchanged one cheaply.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if (defined(__x86_64__) || defined(__i386__)) && !defined(QG_NO_X86) /* -DQG_NO_X86: portable only */
#define QG_X86 1
#include <immintrin.h>
#else
#define QG_X86 0
#endif

/* AMX tiles need GCC 11 / clang 12 and a Linux kernel that grants the tile state (arch_prctl) */
#if QG_X86 && defined(__linux__) && defined(SYS_arch_prctl) &&                                          \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define QG_HAVE_AMX 1
#include <cpuid.h>
#else
#define QG_HAVE_AMX 0
#endif

#define QG_ABI 7
#define NR 64   /* columns per packed panel */
#define KG 4    /* k per group */
#define KPAD 64 /* K padded to this in the packed layout and A's rows (one AMX tile row of bytes) */

enum {
    QG_PATH_PORTABLE = 0,
    QG_PATH_AVX2 = 1,
    QG_PATH_AVXVNNI = 2,
    QG_PATH_AVX512VNNI = 3,
    QG_PATH_AMX = 4,
    QG_NPATHS = 5
};
enum { QG_OUT_I32 = 0, QG_OUT_F32 = 1, QG_OUT_U8 = 2, QG_OUT_S8 = 3 };
enum { QG_OK = 0, QG_ERR_PATH = -1, QG_ERR_ARGS = -2, QG_ERR_NOMEM = -3 };

int opstrata_qgemm_abi(void) { return QG_ABI; }

/* ------------------------------------------------------------------ CPU features */

static int qg_avx512vnni(void) {
#if QG_X86
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}
static int qg_avxvnni_vex(void) {
#if QG_X86 && defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
    return __builtin_cpu_supports("avxvnni") && __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}
static int qg_avx2(void) {
#if QG_X86
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

/* AMX-INT8: the CPU has the tiles (CPUID.7.0:EDX bits 24, 25), AVX-512 VNNI for the row tails, and the
   kernel grants this process the tile data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, asked
   once; a kernel older than 5.16 or a seccomp policy refusing it leaves the path off) */
#if QG_HAVE_AMX
static int qg_amx_granted;
static pthread_once_t qg_amx_once = PTHREAD_ONCE_INIT;
static void qg_amx_request(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return;
    qg_amx_granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}
#endif
static int qg_amx(void) {
#if QG_HAVE_AMX
    pthread_once(&qg_amx_once, qg_amx_request);
    return qg_amx_granted && qg_avx512vnni();
#else
    return 0;
#endif
}

/* bit i set: path i runs on this CPU */
int opstrata_qgemm_paths(void) {
    int m = 1 << QG_PATH_PORTABLE;
    if (qg_amx()) m |= 1 << QG_PATH_AMX;
    if (qg_avx2()) m |= 1 << QG_PATH_AVX2;
    if (qg_avxvnni_vex() || qg_avx512vnni()) m |= 1 << QG_PATH_AVXVNNI;
    if (qg_avx512vnni()) m |= 1 << QG_PATH_AVX512VNNI;
    return m;
}

int opstrata_qgemm_best_path(void) {
    int m = opstrata_qgemm_paths();
    for (int p = QG_NPATHS - 1; p > 0; --p)
        if (m & (1 << p)) return p;
    return QG_PATH_PORTABLE;
}

/* ------------------------------------------------------------------ packing */

static inline int64_t qg_kpad(int64_t K) { return (K + KPAD - 1) / KPAD * KPAD; }
static inline int64_t qg_kgroups(int64_t K) { return (K + KG - 1) / KG; } /* the groups holding data */

int64_t opstrata_qgemm_packed_size(int64_t K, int64_t N) {
    return ((N + NR - 1) / NR) * qg_kpad(K) * NR;
}

/* B: K x N bytes with row stride ldb (elements); b_signed: 1 s8, 0 u8; zb: n_zb (1 or N) int32 zero
   points. Writes packed (opstrata_qgemm_packed_size bytes), colsum[N] = sum_k Bs, zbe[N] = zb'. */
int opstrata_qgemm_pack_b(const uint8_t *B, int64_t ldb, int b_signed, const int32_t *zb, int64_t n_zb,
                          int64_t K, int64_t N, int8_t *packed, int32_t *colsum, int32_t *zbe) {
    if (K < 0 || N < 0 || (n_zb != 1 && n_zb != N) || (N && K && !B) || !packed) return QG_ERR_ARGS;
    const int64_t kp = qg_kpad(K), panels = (N + NR - 1) / NR;
    const uint8_t flip = b_signed ? 0 : 0x80; /* u8 -> s8: b - 128 == b ^ 0x80 as a byte */
    for (int64_t j = 0; j < N; ++j) zbe[j] = (n_zb == 1 ? zb[0] : zb[j]) - (b_signed ? 0 : 128);
    for (int64_t p = 0; p < panels; ++p) { /* written in order; each k-group reads 4 rows of B */
        const int64_t c0 = p * NR, nc = N - c0 < NR ? N - c0 : NR;
        int8_t *dst = packed + p * kp * NR;
        for (int64_t k0 = 0; k0 < kp; k0 += KG, dst += NR * KG) {
            int64_t c = 0;
#if defined(__SSE2__) && !defined(QG_NO_X86)
            if (k0 + KG <= K) { /* 4 full rows: interleave 16 columns at a time (SSE2 is x86-64 baseline) */
                const __m128i fl = _mm_set1_epi8((char)flip);
                const uint8_t *r = B + k0 * ldb + c0;
                for (; c + 16 <= nc; c += 16) {
                    const __m128i r0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + c)), fl);
                    const __m128i r1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + ldb + c)), fl);
                    const __m128i r2 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + 2 * ldb + c)), fl);
                    const __m128i r3 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(r + 3 * ldb + c)), fl);
                    const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
                    const __m128i e = _mm_unpacklo_epi8(r2, r3), f = _mm_unpackhi_epi8(r2, r3);
                    _mm_storeu_si128((__m128i *)(dst + c * KG), _mm_unpacklo_epi16(a, e));
                    _mm_storeu_si128((__m128i *)(dst + c * KG + 16), _mm_unpackhi_epi16(a, e));
                    _mm_storeu_si128((__m128i *)(dst + c * KG + 32), _mm_unpacklo_epi16(b, f));
                    _mm_storeu_si128((__m128i *)(dst + c * KG + 48), _mm_unpackhi_epi16(b, f));
                }
            }
#endif
            memset(dst + c * KG, 0, (size_t)((NR - c) * KG));
            for (int t = 0; t < KG && k0 + t < K; ++t) {
                const uint8_t *row = B + (k0 + t) * ldb + c0;
                for (int64_t cc = c; cc < nc; ++cc) dst[cc * KG + t] = (int8_t)(row[cc] ^ flip);
            }
        }
    }
    uint32_t *cs = (uint32_t *)colsum; /* column sums of B as int8, modulo 2^32 (row by row: vectorizes) */
    for (int64_t j = 0; j < N; ++j) cs[j] = 0;
    for (int64_t k = 0; k < K; ++k) {
        const uint8_t *row = B + k * ldb;
        for (int64_t j = 0; j < N; ++j) cs[j] += (uint32_t)(int32_t)(int8_t)(row[j] ^ flip);
    }
    return QG_OK;
}

/* A 64-bit content fingerprint of a K x N byte matrix (row stride ldb). 32 independent 32-bit lanes
   (four 8-lane vectors: GCC vector extensions, AVX2 where the CPU has it), each updated by a bijective
   round (multiply, rotate, multiply: a change in a word always changes its lane); the 1024-bit state
   is then folded into 64 bits with xxHash64's avalanche. Lets a caller reuse a packed weight whose
   array is writeable but unchanged at a fraction of the cost of packing it again. */
typedef uint32_t qg_v8u __attribute__((vector_size(32)));
#define QG_FPB 128 /* bytes per step */
#define QG_FP_ROUND(v, w)                                                                             \
    do {                                                                                              \
        qg_v8u x_ = (v) + (w) * 0x85EBCA77u;                                                          \
        x_ = (x_ << 13) | (x_ >> 19);                                                                 \
        (v) = x_ * 0x9E3779B1u;                                                                       \
    } while (0)
static inline __attribute__((always_inline)) uint64_t qg_fp_body(const uint8_t *B, int64_t ldb, int64_t K,
                                                                 int64_t N) {
    qg_v8u v0 = {1, 2, 3, 4, 5, 6, 7, 8}, v1 = v0 + 8, v2 = v0 + 16, v3 = v0 + 24;
    for (int64_t k = 0; k < K; ++k) {
        const uint8_t *row = B + k * ldb;
        int64_t j = 0;
        for (; j + QG_FPB <= N; j += QG_FPB) {
            qg_v8u w0, w1, w2, w3;
            memcpy(&w0, row + j, 32);
            memcpy(&w1, row + j + 32, 32);
            memcpy(&w2, row + j + 64, 32);
            memcpy(&w3, row + j + 96, 32);
            QG_FP_ROUND(v0, w0);
            QG_FP_ROUND(v1, w1);
            QG_FP_ROUND(v2, w2);
            QG_FP_ROUND(v3, w3);
        }
        if (j < N || N == 0) { /* the row's tail, zero padded, its length marked (also marks empty rows) */
            uint8_t t[QG_FPB];
            qg_v8u w0, w1, w2, w3;
            memset(t, 0, sizeof t);
            memcpy(t, row + j, (size_t)(N - j));
            t[QG_FPB - 1] ^= (uint8_t)(N - j) | 0x80;
            memcpy(&w0, t, 32);
            memcpy(&w1, t + 32, 32);
            memcpy(&w2, t + 64, 32);
            memcpy(&w3, t + 96, 32);
            QG_FP_ROUND(v0, w0);
            QG_FP_ROUND(v1, w1);
            QG_FP_ROUND(v2, w2);
            QG_FP_ROUND(v3, w3);
        }
    }
    uint32_t lanes[32];
    memcpy(lanes, &v0, 32);
    memcpy(lanes + 8, &v1, 32);
    memcpy(lanes + 16, &v2, 32);
    memcpy(lanes + 24, &v3, 32);
    uint64_t h = (uint64_t)K * 0x165667B19E3779F9ULL ^ (uint64_t)N;
    for (int l = 0; l < 32; ++l) {
        h ^= lanes[l];
        h *= 0xC2B2AE3D27D4EB4FULL;
        h ^= h >> 31;
    }
    h ^= h >> 33;
    h *= 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 29;
    h *= 0x165667B19E3779F9ULL;
    h ^= h >> 32;
    return h;
}
static uint64_t qg_fp_generic(const uint8_t *B, int64_t ldb, int64_t K, int64_t N) {
    return qg_fp_body(B, ldb, K, N);
}
#if QG_X86
__attribute__((target("avx2"))) static uint64_t qg_fp_avx2(const uint8_t *B, int64_t ldb, int64_t K,
                                                           int64_t N) {
    return qg_fp_body(B, ldb, K, N);
}
#endif

uint64_t opstrata_qgemm_fingerprint(const uint8_t *B, int64_t ldb, int64_t K, int64_t N) {
#if QG_X86
    if (qg_avx2()) return qg_fp_avx2(B, ldb, K, N);
#endif
    return qg_fp_generic(B, ldb, K, N);
}

/* ------------------------------------------------------------------ epilogue */

typedef struct {
    int kind;            /* QG_OUT_* */
    void *out;           /* M x N, row stride ldo (elements) */
    int64_t ldo;
    const int32_t *colsum, *zbe; /* per column (N) */
    const int32_t *zae;  /* za' per row (M) */
    const int32_t *rterm;/* rowsum(Au) - K za' per row (M) */
    const float *a_scale; int a_scale_rows; /* 1 or M values */
    const float *b_scale; int b_scale_cols; /* 1 or N values (f32: b's scale; u8/s8: the multiplier) */
    const float *bias;   /* N or NULL */
    int relu;
    int32_t y_zp;
    int64_t ocs;         /* f32 only: 0 = row-major out; else column c of row i goes to
                            out[qg_row_base(e, i) + c * ocs] (a convolution's rows are pixels: NCHW output,
                            channel stride ocs; rows of image i / ocs start img_stride apart) */
    int64_t img_stride;
    int za_same, zb_zero; /* set by qg_epi_scan: one za' for every row; zb' 0 in every column */
} qg_epi;

/* the zero-point facts the vector epilogue specialises on (a symmetric int8 weight has zb' == 0 in every
   column; per-tensor and symmetric per-token activations one za' for all rows): O(M + N) once per call */
static void qg_epi_scan(qg_epi *e, int64_t M, int64_t N) {
    e->za_same = 1;
    for (int64_t i = 1; i < M && e->za_same; ++i) e->za_same = e->zae[i] == e->zae[0];
    e->zb_zero = 1;
    for (int64_t j = 0; j < N && e->zb_zero; ++j) e->zb_zero = e->zbe[j] == 0;
}

/* where row i of a channel-major (conv) output starts: pixel i % ocs of image i / ocs */
static inline int64_t qg_row_base(const qg_epi *e, int64_t i) {
    return e->ocs ? (i / e->ocs) * e->img_stride + i % e->ocs : i * e->ldo;
}

/* tile: mr x nc int32 dot products (row stride NR) for rows r0.., columns c0..; writes the output */
static inline __attribute__((always_inline)) void qg_epilogue(const qg_epi *e, const int32_t *tile, int mr,
                                                              int64_t r0, int64_t c0, int nc) {
    const int32_t *cs = e->colsum + c0, *zb = e->zbe + c0;
    for (int r = 0; r < mr; ++r) {
        const int64_t i = r0 + r;
        const uint32_t za = (uint32_t)e->zae[i], rt = (uint32_t)e->rterm[i];
        const int32_t *t = tile + r * NR;
        int32_t acc[NR];
        for (int c = 0; c < nc; ++c) /* wrapping int32 arithmetic: exact modulo 2^32 */
            acc[c] = (int32_t)((uint32_t)t[c] - za * (uint32_t)cs[c] - (uint32_t)zb[c] * rt);
        if (e->kind == QG_OUT_I32) {
            memcpy((int32_t *)e->out + i * e->ldo + c0, acc, sizeof(int32_t) * (size_t)nc);
        } else if (e->kind == QG_OUT_F32) {
            const int64_t cs = e->ocs ? e->ocs : 1;
            float *o = (float *)e->out + qg_row_base(e, i) + c0 * cs;
            const float sa = e->a_scale[e->a_scale_rows ? i : 0];
            const float *sb = e->b_scale + (e->b_scale_cols ? c0 : 0);
            const int sbs = e->b_scale_cols ? 1 : 0;
            const float *bias = e->bias ? e->bias + c0 : NULL;
            for (int c = 0; c < nc; ++c) {
                float v = (float)acc[c] * (sa * sb[c * sbs]);
                if (bias) v += bias[c];
                if (e->relu) v = v > 0.0f ? v : 0.0f;
                o[c * cs] = v;
            }
        } else { /* requantize: saturate(rint(acc * multiplier) + y_zp), multiplier float32, product double */
            const float *mul = e->b_scale + (e->b_scale_cols ? c0 : 0);
            const int ms = e->b_scale_cols ? 1 : 0;
            const double lo = e->kind == QG_OUT_U8 ? 0.0 : -128.0, hi = e->kind == QG_OUT_U8 ? 255.0 : 127.0;
            double v[NR];
            for (int c = 0; c < nc; ++c) {
                double d = nearbyint((double)acc[c] * (double)mul[c * ms]) + (double)e->y_zp;
                v[c] = d < lo ? lo : (d > hi ? hi : d);
            }
            if (e->kind == QG_OUT_U8) {
                uint8_t *o = (uint8_t *)e->out + i * e->ldo + c0;
                for (int c = 0; c < nc; ++c) o[c] = (uint8_t)(int)v[c];
            } else {
                int8_t *o = (int8_t *)e->out + i * e->ldo + c0;
                for (int c = 0; c < nc; ++c) o[c] = (int8_t)(int)v[c];
            }
        }
    }
}

static inline int64_t qg_load8(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline int32_t qg_load4(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------ micro-kernels
   A: u8 rows (stride lda, padded to a multiple of 4 bytes with zeros), Bp: one panel (kg groups of
   NR*KG bytes). Each writes an mr x NR int32 tile (row stride NR); nv = 16-column vectors used (1..4). */

#define MR_MAX 6       /* rows per vector micro-tile */
#define QG_TILE_ROWS 32 /* rows of the largest micro-tile (AMX: 32 x 64) */

static void qg_mk_portable(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t kg, int mr, int nv,
                           int32_t *tile) {
    /* per k-group, B's 4 x nc bytes are widened once into contiguous int16 rows (bw[t][c]); each row of
       A then adds a_t * bw[t][c] over contiguous columns, which compilers vectorize for any target
       (16 x 16 -> 32-bit widening multiplies). Products fit int16; sums wrap modulo 2^32. */
    const int nc = nv * 16;
    int32_t acc[MR_MAX][NR];
    int16_t bw[KG][NR];
    for (int r = 0; r < mr; ++r)
        for (int c = 0; c < nc; ++c) acc[r][c] = 0;
    for (int64_t g = 0; g < kg; ++g) {
        const int8_t *b = Bp + g * (NR * KG);
        for (int c = 0; c < nc; ++c)
            for (int t = 0; t < KG; ++t) bw[t][c] = b[KG * c + t];
        for (int r = 0; r < mr; ++r) {
            const uint8_t *a = A + r * lda + KG * g;
            for (int t = 0; t < KG; ++t) {
                const int32_t at = a[t];
                int32_t *restrict o = acc[r];
                const int16_t *restrict bt = bw[t];
                for (int c = 0; c < nc; ++c) o[c] = (int32_t)((uint32_t)o[c] + (uint32_t)(at * (int32_t)bt[c]));
            }
        }
    }
    for (int r = 0; r < mr; ++r) memcpy(tile + r * NR, acc[r], sizeof(int32_t) * (size_t)nc);
}

#if QG_X86

/* ---- AVX-512 VNNI: up to 6 rows x 4 zmm (64 columns) of accumulators */
#define T512 __attribute__((target("avx512vnni,avx512bw,avx512f,avx512vl,avx2,fma")))

/* explicit accumulator variables (not arrays): GCC keeps them in registers; MR / NV are constants
   after inlining, so the guards fold away */
#define R512_DECL(r)                                                                                  \
    __m512i c##r##0 = _mm512_setzero_si512(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
#define R512_STEP(r)                                                                                  \
    if (MR > r) {                                                                                     \
        const __m512i a = _mm512_set1_epi32(qg_load4(A + r * lda + 4 * g));                          \
        c##r##0 = _mm512_dpbusd_epi32(c##r##0, a, b0);                                                \
        if (NV > 1) c##r##1 = _mm512_dpbusd_epi32(c##r##1, a, b1);                                    \
        if (NV > 2) c##r##2 = _mm512_dpbusd_epi32(c##r##2, a, b2);                                    \
        if (NV > 3) c##r##3 = _mm512_dpbusd_epi32(c##r##3, a, b3);                                    \
    }
#define R512_STORE(r)                                                                                 \
    if (MR > r) {                                                                                     \
        _mm512_storeu_si512((void *)(tile + r * NR), c##r##0);                                        \
        if (NV > 1) _mm512_storeu_si512((void *)(tile + r * NR + 16), c##r##1);                       \
        if (NV > 2) _mm512_storeu_si512((void *)(tile + r * NR + 32), c##r##2);                       \
        if (NV > 3) _mm512_storeu_si512((void *)(tile + r * NR + 48), c##r##3);                       \
    }

static inline __attribute__((always_inline)) T512 void qg_mk512_body(const uint8_t *A, int64_t lda,
                                                                    const int8_t *Bp, int64_t kg,
                                                                    const int MR, const int NV,
                                                                    int32_t *tile) {
    R512_DECL(0) R512_DECL(1) R512_DECL(2) R512_DECL(3) R512_DECL(4) R512_DECL(5)
    for (int64_t g = 0; g < kg; ++g) {
        const int8_t *b = Bp + g * (NR * KG);
        const __m512i b0 = _mm512_loadu_si512((const void *)b);
        const __m512i b1 = NV > 1 ? _mm512_loadu_si512((const void *)(b + 64)) : b0;
        const __m512i b2 = NV > 2 ? _mm512_loadu_si512((const void *)(b + 128)) : b0;
        const __m512i b3 = NV > 3 ? _mm512_loadu_si512((const void *)(b + 192)) : b0;
        R512_STEP(0) R512_STEP(1) R512_STEP(2) R512_STEP(3) R512_STEP(4) R512_STEP(5)
    }
    R512_STORE(0) R512_STORE(1) R512_STORE(2) R512_STORE(3) R512_STORE(4) R512_STORE(5)
}

#define MK512(MRv, NVv)                                                                               \
    static T512 void qg_mk512_##MRv##_##NVv(const uint8_t *A, int64_t lda, const int8_t *Bp,          \
                                            int64_t kg, int32_t *tile) {                              \
        qg_mk512_body(A, lda, Bp, kg, MRv, NVv, tile);                                                \
    }
#define MK512_ROW(MRv) MK512(MRv, 1) MK512(MRv, 2) MK512(MRv, 3) MK512(MRv, 4)
MK512_ROW(1) MK512_ROW(2) MK512_ROW(3) MK512_ROW(4) MK512_ROW(5) MK512_ROW(6)

typedef void (*qg_mk_fn)(const uint8_t *, int64_t, const int8_t *, int64_t, int32_t *);
#define MKTAB(P) {{P##_1_1, P##_1_2, P##_1_3, P##_1_4}, {P##_2_1, P##_2_2, P##_2_3, P##_2_4},        \
                  {P##_3_1, P##_3_2, P##_3_3, P##_3_4}, {P##_4_1, P##_4_2, P##_4_3, P##_4_4},        \
                  {P##_5_1, P##_5_2, P##_5_3, P##_5_4}, {P##_6_1, P##_6_2, P##_6_3, P##_6_4}}
static const qg_mk_fn qg_mk512_tab[6][4] = MKTAB(qg_mk512);

/* ---- 256-bit VNNI: up to 6 rows x 2 ymm (16 columns), looped over the panel's 16-column slices */
#define R256_STEP(r, DPBUSD)                                                                          \
    if (MR > r) {                                                                                     \
        const __m256i a = _mm256_set1_epi32(qg_load4(A + r * lda + 4 * g));                          \
        c##r##0 = DPBUSD(c##r##0, a, b0);                                                             \
        c##r##1 = DPBUSD(c##r##1, a, b1);                                                             \
    }
#define R256_STORE(r)                                                                                 \
    if (MR > r) {                                                                                     \
        _mm256_storeu_si256((__m256i *)(tile + r * NR + 8 * s), c##r##0);                             \
        _mm256_storeu_si256((__m256i *)(tile + r * NR + 8 * s + 8), c##r##1);                         \
    }
#define QG_MK256_VNNI_BODY(DPBUSD)                                                                    \
    for (int s = 0; s < 2 * NV; s += 2) {                                                             \
        __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;  \
        __m256i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;                     \
        for (int64_t g = 0; g < kg; ++g) {                                                            \
            const int8_t *b = Bp + g * (NR * KG) + 32 * s;                                            \
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)b);                                \
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + 32));                         \
            R256_STEP(0, DPBUSD) R256_STEP(1, DPBUSD) R256_STEP(2, DPBUSD)                            \
            R256_STEP(3, DPBUSD) R256_STEP(4, DPBUSD) R256_STEP(5, DPBUSD)                            \
        }                                                                                             \
        R256_STORE(0) R256_STORE(1) R256_STORE(2) R256_STORE(3) R256_STORE(4) R256_STORE(5)          \
    }

#define T256E __attribute__((target("avx512vnni,avx512vl,avx512f,avx2")))
static inline __attribute__((always_inline)) T256E void qg_mk256e_body(const uint8_t *A, int64_t lda,
                                                                      const int8_t *Bp, int64_t kg,
                                                                      const int MR, const int NV,
                                                                      int32_t *tile) {
    QG_MK256_VNNI_BODY(_mm256_dpbusd_epi32)
}
#define MK256E(MRv, NVv)                                                                              \
    static T256E void qg_mk256e_##MRv##_##NVv(const uint8_t *A, int64_t lda, const int8_t *Bp,        \
                                              int64_t kg, int32_t *tile) {                            \
        qg_mk256e_body(A, lda, Bp, kg, MRv, NVv, tile);                                               \
    }
#define MK256E_ROW(MRv) MK256E(MRv, 1) MK256E(MRv, 2) MK256E(MRv, 3) MK256E(MRv, 4)
MK256E_ROW(1) MK256E_ROW(2) MK256E_ROW(3) MK256E_ROW(4) MK256E_ROW(5) MK256E_ROW(6)
static const qg_mk_fn qg_mk256e_tab[6][4] = MKTAB(qg_mk256e);

#if defined(__GNUC__) && (__GNUC__ >= 11 || defined(__clang__))
#define QG_HAVE_AVXVNNI 1
#define T256V __attribute__((target("avxvnni,avx2")))
static inline __attribute__((always_inline)) T256V void qg_mk256v_body(const uint8_t *A, int64_t lda,
                                                                      const int8_t *Bp, int64_t kg,
                                                                      const int MR, const int NV,
                                                                      int32_t *tile) {
    QG_MK256_VNNI_BODY(_mm256_dpbusd_avx_epi32)
}
#define MK256V(MRv, NVv)                                                                              \
    static T256V void qg_mk256v_##MRv##_##NVv(const uint8_t *A, int64_t lda, const int8_t *Bp,        \
                                              int64_t kg, int32_t *tile) {                            \
        qg_mk256v_body(A, lda, Bp, kg, MRv, NVv, tile);                                               \
    }
#define MK256V_ROW(MRv) MK256V(MRv, 1) MK256V(MRv, 2) MK256V(MRv, 3) MK256V(MRv, 4)
MK256V_ROW(1) MK256V_ROW(2) MK256V_ROW(3) MK256V_ROW(4) MK256V_ROW(5) MK256V_ROW(6)
static const qg_mk_fn qg_mk256v_tab[6][4] = MKTAB(qg_mk256v);
#else
#define QG_HAVE_AVXVNNI 0
#endif

/* ---- AVX2, exact: u8 and s8 widened to int16, vpmaddwd sums pairs of products into int32.
   Per 8-column slice and k-group: the 32 packed bytes (8 columns x 4 k) become two int16 vectors
   (columns 0-3, 4-7); A comes pre-widened to u16 rows, its 4 values broadcast as [a0 a1 a2 a3] x 4.
   vpmaddwd leaves two partial sums per column; vphaddd + a 64-bit permute finish them at the end. */
#define T2 __attribute__((target("avx2,fma")))
static inline __attribute__((always_inline)) T2 void qg_mk2_body(const uint8_t *A, int64_t lda,
                                                                const int8_t *Bp, int64_t kg,
                                                                const int MR, const int NV,
                                                                int32_t *tile) {
    for (int s = 0; s < 2 * NV; ++s) { /* 8-column slices */
        __m256i l0 = _mm256_setzero_si256(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
#pragma GCC unroll 4
        for (int64_t g = 0; g < kg; ++g) {
            const int8_t *bs = Bp + g * (NR * KG) + 32 * s; /* vpmovsxbw straight from memory */
            const __m256i b_lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)bs));
            const __m256i b_hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(bs + 16)));
#define R2_STEP(r)                                                                                    \
    if (MR > r) {                                                                                     \
        const __m256i a = _mm256_set1_epi64x(qg_load8(A + r * lda + 8 * g));                          \
        l##r = _mm256_add_epi32(l##r, _mm256_madd_epi16(a, b_lo));                                    \
        h##r = _mm256_add_epi32(h##r, _mm256_madd_epi16(a, b_hi));                                    \
    }
            R2_STEP(0) R2_STEP(1) R2_STEP(2) R2_STEP(3)
        }
#define R2_STORE(r)                                                                                   \
    if (MR > r)                                                                                       \
        _mm256_storeu_si256((__m256i *)(tile + r * NR + 8 * s),                                       \
                            _mm256_permute4x64_epi64(_mm256_hadd_epi32(l##r, h##r), 0xD8));
        R2_STORE(0) R2_STORE(1) R2_STORE(2) R2_STORE(3)
    }
}
#define MK2(MRv, NVv)                                                                                 \
    static T2 void qg_mk2_##MRv##_##NVv(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t kg,  \
                                        int32_t *tile) {                                              \
        qg_mk2_body(A, lda, Bp, kg, MRv, NVv, tile);                                                  \
    }
#define MK2_ROW(MRv) MK2(MRv, 1) MK2(MRv, 2) MK2(MRv, 3) MK2(MRv, 4)
MK2_ROW(1) MK2_ROW(2) MK2_ROW(3) MK2_ROW(4)
static const qg_mk_fn qg_mk2_tab[4][4] = {{qg_mk2_1_1, qg_mk2_1_2, qg_mk2_1_3, qg_mk2_1_4},
                                          {qg_mk2_2_1, qg_mk2_2_2, qg_mk2_2_3, qg_mk2_2_4},
                                          {qg_mk2_3_1, qg_mk2_3_2, qg_mk2_3_3, qg_mk2_3_4},
                                          {qg_mk2_4_1, qg_mk2_4_2, qg_mk2_4_3, qg_mk2_4_4}};

#if QG_HAVE_AMX
/* ---- AMX-INT8: tdpbusd multiplies a 16 x 64-byte u8 tile of A by a 16-row s8 tile of B holding 16 columns
   x 4 consecutive k per row, which is exactly one 64-byte slice of a packed k-group: the B tile of columns
   16c..16c+15 and k-groups 16q..16q+15 is read straight from the panel with a 256-byte row stride. K is
   padded to 64 (KPAD) in both operands, so every tile is whole; rows past the last 16 go to the VNNI
   kernel. All eight tiles are 16 rows x 64 bytes: C in 0-3, A in 4-5, B in 6-7. */
#define TAMX __attribute__((target("amx-tile,amx-int8,avx512vnni,avx512bw,avx512f,avx512vl,avx2,fma")))
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} qg_tilecfg;

static TAMX void qg_amx_configure(void) {
    qg_tilecfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; ++t) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    /* GCC does not know ldtilecfg reads the struct and drops the stores without this barrier */
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

#define QG_BSTRIDE (NR * KG)       /* bytes between k-groups of a panel */
#define QG_BCHUNK (16 * QG_BSTRIDE) /* bytes per 64 k of a panel */

/* 32 rows x 32 columns (tile row stride NR int32): A rows r..r+31 (stride lda), Bp at the first column */
static TAMX void qg_amx_32x32(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t chunks, int32_t *tile) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q = 0; q < chunks; ++q) {
        const int8_t *b = Bp + q * QG_BCHUNK;
        _tile_loadd(4, A + q * KPAD, lda);
        _tile_loadd(6, b, QG_BSTRIDE);
        _tile_loadd(7, b + 16 * KG, QG_BSTRIDE);
        _tile_loadd(5, A + 16 * lda + q * KPAD, lda);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, tile, NR * 4);
    _tile_stored(1, tile + 16, NR * 4);
    _tile_stored(2, tile + 16 * NR, NR * 4);
    _tile_stored(3, tile + 16 * NR + 16, NR * 4);
}

/* 16 rows x 64 columns (the whole panel), the B tiles alternating */
static TAMX void qg_amx_16x64(const uint8_t *A, int64_t lda, const int8_t *Bp, int64_t chunks, int32_t *tile) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t q = 0; q < chunks; ++q) {
        const int8_t *b = Bp + q * QG_BCHUNK;
        _tile_loadd(4, A + q * KPAD, lda);
        _tile_loadd(6, b, QG_BSTRIDE);
        _tile_dpbusd(0, 4, 6);
        _tile_loadd(7, b + 16 * KG, QG_BSTRIDE);
        _tile_dpbusd(1, 4, 7);
        _tile_loadd(6, b + 32 * KG, QG_BSTRIDE);
        _tile_dpbusd(2, 4, 6);
        _tile_loadd(7, b + 48 * KG, QG_BSTRIDE);
        _tile_dpbusd(3, 4, 7);
    }
    _tile_stored(0, tile, NR * 4);
    _tile_stored(1, tile + 16, NR * 4);
    _tile_stored(2, tile + 32, NR * 4);
    _tile_stored(3, tile + 48, NR * 4);
}

static TAMX void qg_amx_release(void) { _tile_release(); }
#endif /* QG_HAVE_AMX */

/* the epilogue compiled for the wide paths (the loops vectorize with that ISA) */
static T512 void qg_epi_512(const qg_epi *e, const int32_t *t, int mr, int64_t r0, int64_t c0, int nc) {
    qg_epilogue(e, t, mr, r0, c0, nc);
}
static T2 void qg_epi_2(const qg_epi *e, const int32_t *t, int mr, int64_t r0, int64_t c0, int nc) {
    qg_epilogue(e, t, mr, r0, c0, nc);
}

/* the float32 epilogue in zmm registers, 16 columns per step (masked tail): the zero-point corrections in
   wrapping int32, then acc * (a_scale * b_scale) (+ bias) (ReLU); the generic loop above does not
   vectorise its per-column/per-tensor scale stride */
/* the row-major float32 epilogue (a GEMM's output): each row's up to four 16-column vectors in turn, the
   column terms loaded once per tile and every field of e read into a local (the stores cannot alias them) */
static inline __attribute__((always_inline)) T512 void qg_epi_f32_rows_512(const qg_epi *e, const int32_t *t,
                                                                           int mr, int64_t r0, int64_t c0,
                                                                           int nc, const int za_same,
                                                                           const int zb_zero) {
    const int nv = (nc + 15) / 16, relu = e->relu, has_bias = e->bias != NULL, asr = e->a_scale_rows;
    const int32_t *zae = e->zae, *rterm = e->rterm;
    const float *as = e->a_scale;
    float *out = (float *)e->out + c0;
    const int64_t ldo = e->ldo;
    __m512i csv[4], zbv[4], zcs[4];
    __m512 sbv[4], bv[4];
    __mmask16 mk[4];
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
        const int c = 16 * v;
        mk[v] = v >= nv ? 0 : (nc - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nc - c)) - 1u));
        csv[v] = _mm512_maskz_loadu_epi32(mk[v], e->colsum + c0 + c);
        zbv[v] = _mm512_maskz_loadu_epi32(mk[v], e->zbe + c0 + c);
        sbv[v] = e->b_scale_cols ? _mm512_maskz_loadu_ps(mk[v], e->b_scale + c0 + c) : _mm512_set1_ps(e->b_scale[0]);
        bv[v] = has_bias ? _mm512_maskz_loadu_ps(mk[v], e->bias + c0 + c) : zero;
        zcs[v] = _mm512_mullo_epi32(_mm512_set1_epi32(zae[r0]), csv[v]);
    }
    for (int r = 0; r < mr; ++r) {
        const int64_t i = r0 + r;
        const __m512i za = _mm512_set1_epi32(zae[i]), rt = _mm512_set1_epi32(rterm[i]);
        const __m512 sa = _mm512_set1_ps(as[asr ? i : 0]);
        float *o = out + i * ldo;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
            if (v >= nv) break;
            __m512i acc = _mm512_load_si512((const void *)(t + r * NR + 16 * v)); /* whole tile rows */
            acc = _mm512_sub_epi32(acc, za_same ? zcs[v] : _mm512_mullo_epi32(za, csv[v]));
            if (!zb_zero) acc = _mm512_sub_epi32(acc, _mm512_mullo_epi32(zbv[v], rt));
            __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sa, sbv[v]));
            if (has_bias) y = _mm512_add_ps(y, bv[v]);
            if (relu) y = _mm512_max_ps(y, zero);
            _mm512_mask_storeu_ps(o + 16 * v, mk[v], y);
        }
    }
}

/* the channel-major float32 epilogue (a convolution's NCHW output) for rows on consecutive pixels of one
   image: per output channel, 16 rows at a time as one vector (the tile's column read with a gather) and
   stored as one run of the channel's plane; the same integer and float operations per value as the
   row-wise form, so the same bits */
/* r[i] = row i of a 16 x 16 int32 block -> r[c] = column c (unpacks within 128-bit lanes, then lane shuffles) */
static inline __attribute__((always_inline)) T512 void qg_transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) { /* u[4i + k], lane L: column 4L + k of rows 4i..4i+3 */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int k = 0; k < 4; ++k) {
        t[k] = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
        t[4 + k] = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xdd);
        t[8 + k] = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
        t[12 + k] = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xdd);
    }
    for (int k = 0; k < 4; ++k) {
        r[k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);
        r[4 + k] = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0x88);
        r[12 + k] = _mm512_shuffle_i32x4(t[4 + k], t[12 + k], 0xdd);
    }
}

static inline __attribute__((always_inline)) T512 void qg_epi_f32_planes_512(const qg_epi *e, const int32_t *t,
                                                                             int mr, int64_t r0, int64_t c0,
                                                                             int nc, int64_t first,
                                                                             const int zb_zero, const int za_same) {
    float *out = (float *)e->out + first;
    const int64_t ocs = e->ocs;
    const int relu = e->relu, asr = e->a_scale_rows, sbc = e->b_scale_cols;
    const float *bias = e->bias;
    const __m512 zero = _mm512_setzero_ps();
    for (int rb = 0; rb < mr; rb += 16) {
        const int nr = mr - rb >= 16 ? 16 : mr - rb;
        const __mmask16 m = nr == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1u);
        const __m512i za = _mm512_maskz_loadu_epi32(m, e->zae + r0 + rb);
        const __m512i rt = _mm512_maskz_loadu_epi32(m, e->rterm + r0 + rb);
        const __m512 sa = asr ? _mm512_maskz_loadu_ps(m, e->a_scale + r0 + rb) : _mm512_set1_ps(e->a_scale[0]);
        __m512i col[16];
        for (int c = 0; c < nc; ++c) {
            const int64_t cc = c0 + c;
            if ((c & 15) == 0) { /* the next 16 columns of these rows, transposed: one vector per column */
                const int w = nc - c >= 16 ? 16 : nc - c;
                const __mmask16 cm = w == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1u);
                for (int i = 0; i < 16; ++i)
                    col[i] = i < nr ? _mm512_maskz_loadu_epi32(cm, t + (rb + i) * NR + c) : _mm512_setzero_si512();
                qg_transpose16_epi32(col);
            }
            __m512i acc = col[c & 15];
            acc = _mm512_sub_epi32(acc, za_same ? _mm512_set1_epi32(e->zae[0] * e->colsum[cc])
                                                : _mm512_mullo_epi32(za, _mm512_set1_epi32(e->colsum[cc])));
            if (!zb_zero) acc = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(e->zbe[cc]), rt));
            const __m512 sc = _mm512_mul_ps(sa, _mm512_set1_ps(e->b_scale[sbc ? cc : 0]));
            __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), sc);
            if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(bias[cc]));
            if (relu) v = _mm512_max_ps(v, zero);
            _mm512_mask_storeu_ps(out + cc * ocs + rb, m, v);
        }
    }
}

static T512 void qg_epi_f32_512(const qg_epi *e, const int32_t *t, int mr, int64_t r0, int64_t c0, int nc) {
    if (!e->ocs) { /* specialised on the zero points: the common symmetric-weight case has no per-row term */
        if (e->zb_zero) {
            if (e->za_same)
                qg_epi_f32_rows_512(e, t, mr, r0, c0, nc, 1, 1);
            else
                qg_epi_f32_rows_512(e, t, mr, r0, c0, nc, 0, 1);
        } else {
            qg_epi_f32_rows_512(e, t, mr, r0, c0, nc, 0, 0);
        }
        return;
    }
    for (int r = 0; r < mr;) { /* NCHW: the tile's rows in runs of one image's consecutive pixels */
        const int64_t i = r0 + r, next_image = (i / e->ocs + 1) * e->ocs;
        const int len = (int)(next_image - i < mr - r ? next_image - i : mr - r);
        if (e->zb_zero && e->za_same)
            qg_epi_f32_planes_512(e, t + r * NR, len, i, c0, nc, qg_row_base(e, i), 1, 1);
        else if (e->zb_zero)
            qg_epi_f32_planes_512(e, t + r * NR, len, i, c0, nc, qg_row_base(e, i), 1, 0);
        else
            qg_epi_f32_planes_512(e, t + r * NR, len, i, c0, nc, qg_row_base(e, i), 0, 0);
        r += len;
    }
}
#endif /* QG_X86 */

static void qg_epi_portable(const qg_epi *e, const int32_t *t, int mr, int64_t r0, int64_t c0, int nc) {
    qg_epilogue(e, t, mr, r0, c0, nc);
}

/* ------------------------------------------------------------------ driver */

typedef void (*qg_epi_fn)(const qg_epi *, const int32_t *, int, int64_t, int64_t, int);

typedef struct {
    int path, mr_max;
    const uint8_t *A;  /* u8, padded rows */
    int64_t lda, M, N, kg, kp; /* kg: k-groups holding data (the vector kernels' loop); kp: padded K */
    const int8_t *Bp;
    const qg_epi *e;
    int64_t r_begin, r_end, p_begin, p_end; /* rows and panels of this worker */
} qg_job;

#if QG_HAVE_AMX
/* the AMX path: 32 x 64 blocks (two 32 x 32 tile products), then one 16 x 64, the last < 16 rows on VNNI */
static void qg_run_amx(const qg_job *j) {
    const int64_t kp = j->kp, chunks = kp / KPAD;
    const int64_t MC = 256; /* rows per A block (L2) */
    const qg_epi_fn epi = j->e->kind == QG_OUT_F32 ? qg_epi_f32_512 : qg_epi_512;
    int32_t tile[QG_TILE_ROWS * NR] __attribute__((aligned(64)));
    const int tiles = j->r_end - j->r_begin >= 16; /* fewer rows: VNNI only, no tile state to set up */
    if (tiles) qg_amx_configure();
    for (int64_t m0 = j->r_begin; m0 < j->r_end; m0 += MC) {
        const int64_t m1 = m0 + MC < j->r_end ? m0 + MC : j->r_end;
        for (int64_t p = j->p_begin; p < j->p_end; ++p) {
            const int8_t *bp = j->Bp + p * kp * NR;
            const int64_t c0 = p * NR;
            const int nc = (int)(j->N - c0 < NR ? j->N - c0 : NR);
            int64_t r0 = m0;
            for (; r0 + 32 <= m1; r0 += 32) {
                const uint8_t *a = j->A + r0 * j->lda;
                qg_amx_32x32(a, j->lda, bp, chunks, tile);
                if (nc > 32) qg_amx_32x32(a, j->lda, bp + 32 * KG, chunks, tile + 32);
                epi(j->e, tile, 32, r0, c0, nc);
            }
            if (r0 + 16 <= m1) {
                qg_amx_16x64(j->A + r0 * j->lda, j->lda, bp, chunks, tile);
                epi(j->e, tile, 16, r0, c0, nc);
                r0 += 16;
            }
            for (; r0 < m1; r0 += MR_MAX) {
                const int mr = (int)(m1 - r0 < MR_MAX ? m1 - r0 : MR_MAX);
                qg_mk512_tab[mr - 1][(nc + 15) / 16 - 1](j->A + r0 * j->lda, j->lda, bp, j->kg, tile);
                epi(j->e, tile, mr, r0, c0, nc);
            }
        }
    }
    if (tiles) qg_amx_release();
}
#endif

static void qg_run(const qg_job *j) {
#if QG_HAVE_AMX
    if (j->path == QG_PATH_AMX) {
        qg_run_amx(j);
        return;
    }
#endif
    const int64_t kp = j->kp;
    const int64_t MC = 192; /* rows per A block (L2) */
    qg_epi_fn epi = qg_epi_portable;
#if QG_X86
    if (j->path == QG_PATH_AVX512VNNI || j->path == QG_PATH_AVXVNNI) epi = qg_epi_512;
    if (j->path == QG_PATH_AVX2 || (j->path == QG_PATH_AVXVNNI && !qg_avx512vnni())) epi = qg_epi_2;
    if (j->e->kind == QG_OUT_F32 && epi == qg_epi_512) epi = qg_epi_f32_512;
#endif
    int32_t tile[QG_TILE_ROWS * NR] __attribute__((aligned(64)));
    for (int64_t m0 = j->r_begin; m0 < j->r_end; m0 += MC) {
        const int64_t m1 = m0 + MC < j->r_end ? m0 + MC : j->r_end;
        for (int64_t p = j->p_begin; p < j->p_end; ++p) {
            const int8_t *bp = j->Bp + p * kp * NR;
            const int64_t c0 = p * NR;
            const int nc = (int)(j->N - c0 < NR ? j->N - c0 : NR);
            const int nv = (nc + 15) / 16;
            for (int64_t r0 = m0; r0 < m1; r0 += j->mr_max) {
                const int mr = (int)(m1 - r0 < j->mr_max ? m1 - r0 : j->mr_max);
                const uint8_t *a = j->A + r0 * j->lda;
                switch (j->path) {
#if QG_X86
                case QG_PATH_AVX512VNNI:
                    qg_mk512_tab[mr - 1][nv - 1](a, j->lda, bp, j->kg, tile);
                    break;
                case QG_PATH_AVXVNNI:
#if QG_HAVE_AVXVNNI
                    if (qg_avxvnni_vex()) {
                        qg_mk256v_tab[mr - 1][nv - 1](a, j->lda, bp, j->kg, tile);
                        break;
                    }
#endif
                    qg_mk256e_tab[mr - 1][nv - 1](a, j->lda, bp, j->kg, tile);
                    break;
                case QG_PATH_AVX2:
                    qg_mk2_tab[mr - 1][nv - 1](a, j->lda, bp, j->kg, tile);
                    break;
#endif
                default:
                    qg_mk_portable(a, j->lda, bp, j->kg, mr, nv, tile);
                }
                epi(j->e, tile, mr, r0, c0, nc);
            }
        }
    }
}

/* ------------------------------------------------------------------ threads */

typedef void (*qg_job_fn)(const void *);
typedef struct {
    qg_job_fn fn;
    const void *job;
} qg_task;

static void *qg_task_main(void *arg) {
    const qg_task *t = (const qg_task *)arg;
    t->fn(t->job);
    return NULL;
}

/* opstrata-ops' persistent worker pool (its opstrata_pool_run), when the bindings hand it over: the jobs
   then run on its workers instead of threads started per call */
typedef void (*qg_pool_task_fn)(void *, int64_t);
typedef void (*qg_pool_fn)(qg_pool_task_fn, void *, int64_t, int);
static qg_pool_fn qg_pool;

/* log2 of the fewest multiply-adds worth a thread of the int8 GEMM: threads started per call cost ~20-50 us
   (4M on VNNI, ~50 us of work; AMX is ~6x faster: 32M); ops' pool wakes a spinning worker in ~1-2 us (2M on
   VNNI, 16M on AMX: smaller splits lost to the cache traffic between the cores) */
static int qg_min_macs_log2(int path) {
    if (qg_pool) return path == QG_PATH_AMX ? 24 : 21;
    return path == QG_PATH_AMX ? 25 : 22;
}
void opstrata_qgemm_set_pool(void *pool_run) { qg_pool = (qg_pool_fn)pool_run; }

typedef struct {
    qg_job_fn fn;
    const char *jobs;
    size_t stride;
} qg_pool_ctx;
static void qg_pool_task(void *ctx, int64_t t) {
    const qg_pool_ctx *c = (const qg_pool_ctx *)ctx;
    c->fn(c->jobs + (size_t)t * c->stride);
}

/* fn on each of n jobs (job i at (char *)jobs + i * stride), all done before returning: on ops' pool when
   set (a busy pool runs them all on this thread), else job 0 on this thread and the others on threads
   started here and joined (a thread that cannot start has its job done here) */
static void qg_parallel(qg_job_fn fn, const void *jobs, size_t stride, int n) {
    if (qg_pool && n > 1) {
        qg_pool_ctx c = {fn, (const char *)jobs, stride};
        qg_pool(qg_pool_task, &c, n > 64 ? 64 : n, n > 64 ? 64 : n);
        return;
    }
    qg_task tasks[64];
    pthread_t tid[64];
    int started[64] = {0};
    if (n > 64) n = 64;
    for (int t = 1; t < n; ++t) {
        tasks[t].fn = fn;
        tasks[t].job = (const char *)jobs + (size_t)t * stride;
        started[t] = pthread_create(&tid[t], NULL, qg_task_main, &tasks[t]) == 0;
    }
    fn(jobs);
    for (int t = 1; t < n; ++t) {
        if (started[t])
            pthread_join(tid[t], NULL);
        else
            fn(tasks[t].job);
    }
}

static void qg_run_job(const void *j) { qg_run((const qg_job *)j); }

static void qg_drive(int path, int64_t M, int64_t N, int64_t K, const uint8_t *ap, int64_t ald,
                     const int8_t *Bp, const qg_epi *e, int nthreads);

/* C = epilogue(A @ B). path: QG_PATH_* or -1 (best on this CPU). A: M x K bytes (row stride lda),
   a_signed 1 (s8) / 0 (u8); za: 1 or M int32 zero points (n_za). Bp / colsum / zbe from
   opstrata_qgemm_pack_b. kind QG_OUT_*; out: M x N (row stride ldo). a_scale (1 or M) and b_scale
   (1 or N) float32 for QG_OUT_F32; for QG_OUT_U8/S8 b_scale holds the requantization multiplier
   (1 or N) and y_zp the output zero point. Returns QG_OK, QG_ERR_PATH (path not on this CPU),
   QG_ERR_ARGS or QG_ERR_NOMEM. */
int opstrata_qgemm(int path, int64_t M, int64_t N, int64_t K, const uint8_t *A, int64_t lda, int a_signed,
                   const int32_t *za, int64_t n_za, const int8_t *Bp, const int32_t *colsum,
                   const int32_t *zbe, int kind, void *out, int64_t ldo, const float *a_scale,
                   int64_t n_a_scale, const float *b_scale, int64_t n_b_scale, const float *bias, int relu,
                   int32_t y_zp, int nthreads) {
    if (path < 0) path = opstrata_qgemm_best_path();
    if (path >= QG_NPATHS || !(opstrata_qgemm_paths() & (1 << path))) return QG_ERR_PATH;
    if (M < 0 || N < 0 || K < 0 || (n_za != 1 && n_za != M) || kind < 0 || kind > QG_OUT_S8)
        return QG_ERR_ARGS;
    if (kind != QG_OUT_I32 && (!b_scale || (n_b_scale != 1 && n_b_scale != N))) return QG_ERR_ARGS;
    if (kind == QG_OUT_F32 && (!a_scale || (n_a_scale != 1 && n_a_scale != M))) return QG_ERR_ARGS;
    if (M == 0 || N == 0) return QG_OK;
    if (nthreads < 1) nthreads = 1;

    const int64_t kp = qg_kpad(K);
    /* A as u8 rows padded to kp (as u16 for the AVX2 path: its kernel broadcasts 4 widened values
       straight from memory), with za' and rowsum(Au) - K za' per row */
    uint8_t *aw = NULL;
    uint16_t *a16 = NULL;
    const int wide = path == QG_PATH_AVX2;
    int32_t *rows = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)M);
    if (!rows) return QG_ERR_NOMEM;
    int32_t *zae = rows, *rterm = rows + M;
    const uint8_t flip = a_signed ? 0x80 : 0;
    const int copy = a_signed || kp != K || lda != kp;
    if (wide && kp) {
        a16 = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(M * kp));
        if (!a16) {
            free(rows);
            return QG_ERR_NOMEM;
        }
    } else if (copy && kp) {
        aw = (uint8_t *)malloc((size_t)(M * kp));
        if (!aw) {
            free(rows);
            return QG_ERR_NOMEM;
        }
    }
    for (int64_t i = 0; i < M; ++i) {
        const uint8_t *src = A + i * lda;
        uint32_t s = 0;
        if (a16) {
            uint16_t *dst = a16 + i * kp;
            for (int64_t k = 0; k < K; ++k) {
                dst[k] = (uint8_t)(src[k] ^ flip);
                s += dst[k];
            }
            for (int64_t k = K; k < kp; ++k) dst[k] = 0;
        } else if (aw) {
            uint8_t *dst = aw + i * kp;
            for (int64_t k = 0; k < K; ++k) {
                dst[k] = src[k] ^ flip;
                s += dst[k];
            }
            for (int64_t k = K; k < kp; ++k) dst[k] = 0;
        } else {
            for (int64_t k = 0; k < K; ++k) s += src[k];
        }
        const uint32_t z = (uint32_t)(za[n_za == 1 ? 0 : i] + (a_signed ? 128 : 0));
        zae[i] = (int32_t)z;
        rterm[i] = (int32_t)(s - (uint32_t)K * z);
    }
    qg_epi e = {kind, out, ldo, colsum, zbe, zae, rterm, a_scale, n_a_scale != 1,
                b_scale, n_b_scale != 1, bias, relu, y_zp, 0, 0, 0, 0};
    qg_epi_scan(&e, M, N);
    const uint8_t *ap = a16 ? (const uint8_t *)a16 : (aw ? aw : A);
    const int64_t ald = a16 ? 2 * kp : (aw ? kp : lda); /* bytes */
    qg_drive(path, M, N, K, ap, ald, Bp, &e, nthreads);
    free(aw);
    free(a16);
    free(rows);
    return QG_OK;
}

/* the micro-kernels and epilogue over all rows and panels: ap holds A in the path's layout (u8 rows of
   kp bytes, or u16 for AVX2) with row stride ald bytes; threads split rows or panels */
static void qg_drive(int path, int64_t M, int64_t N, int64_t K, const uint8_t *ap, int64_t ald,
                     const int8_t *Bp, const qg_epi *e, int nthreads) {
    const int64_t kg = qg_kgroups(K); /* K == 0: the dot products are 0; one tile of zeros per block */
    const int mr_max = path == QG_PATH_AMX ? 32 : (path == QG_PATH_AVX2 ? 4 : 6);
    const int64_t panels = (N + NR - 1) / NR;
    qg_job base = {path, mr_max, ap, ald, M, N, kg, qg_kpad(K), Bp, e, 0, M, 0, panels};
    /* threads: split rows (in micro-tile multiples) when there are enough, else panels */
    const int by_rows = M >= (int64_t)nthreads * mr_max;
    const int64_t work_units = by_rows ? (M + mr_max - 1) / mr_max : panels;
    if (nthreads > work_units) nthreads = (int)work_units;
    /* each thread gets at least 2^qg_min_macs_log2(path) multiply-adds */
    const int64_t by_work = (M * N * (K ? K : 1)) >> qg_min_macs_log2(path);
    if (nthreads > by_work) nthreads = by_work > 1 ? (int)by_work : 1;
    if (nthreads <= 1) {
        qg_run(&base);
    } else {
        qg_job jobs[64];
        if (nthreads > 64) nthreads = 64;
        for (int t = 0; t < nthreads; ++t) {
            jobs[t] = base;
            int64_t u0 = work_units * t / nthreads, u1 = work_units * (t + 1) / nthreads;
            if (by_rows) {
                jobs[t].r_begin = u0 * mr_max;
                jobs[t].r_end = u1 * mr_max < M ? u1 * mr_max : M;
            } else {
                jobs[t].p_begin = u0;
                jobs[t].p_end = u1;
            }
        }
        qg_parallel(qg_run_job, jobs, sizeof(qg_job), nthreads);
    }
}

/* ONNX DynamicQuantizeLinear of n float32 values, computed as the ONNX reference does in float32: the
   range [lo, hi] widened to include 0, scale = (hi - lo) / 255 (1 when hi == lo), zero point
   rint(clip(0 - lo / scale, 0, 255)), y = clip(rint(x / scale) + zp, 0, 255), round half to even.
   The loops keep QG_DQ_LANES independent lanes (no reassociation needed) so they vectorise; one body,
   compiled for AVX2 and for the baseline. */
typedef float qg_v8f __attribute__((vector_size(32)));
typedef int32_t qg_v8i __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) qg_v8f qg_pick(qg_v8i m, qg_v8f a, qg_v8f b) {
    return (qg_v8f)((m & (qg_v8i)a) | (~m & (qg_v8i)b)); /* a where m, else b */
}
static inline __attribute__((always_inline)) int qg_dq_range(const float *x, int64_t n, float *hi_out,
                                                             float *lo_out) {
    qg_v8f hi0 = {0}, hi1 = {0}, lo0 = {0}, lo1 = {0};
    qg_v8i bad = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) { /* two independent accumulators: max/min need no reassociation */
        qg_v8f a, b;
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, x + i + 8, sizeof b);
        bad |= (a != a) | (b != b);
        hi0 = qg_pick(a > hi0, a, hi0);
        hi1 = qg_pick(b > hi1, b, hi1);
        lo0 = qg_pick(a < lo0, a, lo0);
        lo1 = qg_pick(b < lo1, b, lo1);
    }
    float hi = 0.0f, lo = 0.0f;
    int nan = 0;
    for (int l = 0; l < 8; ++l) {
        nan |= bad[l] != 0;
        hi = hi0[l] > hi ? hi0[l] : hi;
        hi = hi1[l] > hi ? hi1[l] : hi;
        lo = lo0[l] < lo ? lo0[l] : lo;
        lo = lo1[l] < lo ? lo1[l] : lo;
    }
    for (; i < n; ++i) {
        const float v = x[i];
        nan |= v != v;
        hi = v > hi ? v : hi;
        lo = v < lo ? v : lo;
    }
    *hi_out = hi;
    *lo_out = lo;
    return nan;
}

/* rint(v) for |v| < 2^22 as (v + 1.5 * 2^23) - 1.5 * 2^23 in round-to-nearest-even (vectorises without
   SSE4.1's roundps); every value rounded here lies within [-255, 255] since lo <= x <= hi */
#define QG_MAGIC 12582912.0f
static inline __attribute__((always_inline)) void qg_dq_apply(const float *x, int64_t n, float s, float z,
                                                              uint8_t *y) {
    for (int64_t i = 0; i < n; ++i) {
        float q = ((x[i] / s + QG_MAGIC) - QG_MAGIC) + z;
        q = q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q);
        y[i] = (uint8_t)(int32_t)q;
    }
}

static __attribute__((target("avx2"))) int qg_dq_range_avx2(const float *x, int64_t n, float *hi, float *lo) {
    return qg_dq_range(x, n, hi, lo);
}
static __attribute__((target("avx2"))) void qg_dq_apply_avx2(const float *x, int64_t n, float s, float z,
                                                               uint8_t *y) {
    qg_dq_apply(x, n, s, z, y);
}
#if QG_X86
/* AVX-512: the same range and the same rounding (division, round half to even, + zp, clip), 16 lanes */
static T512 int qg_dq_range_512(const float *x, int64_t n, float *hi_out, float *lo_out) {
    __m512 h0 = _mm512_setzero_ps(), h1 = h0, l0 = h0, l1 = h0;
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        bad |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
        h0 = _mm512_max_ps(a, h0); /* a > h ? a : h */
        h1 = _mm512_max_ps(b, h1);
        l0 = _mm512_min_ps(a, l0);
        l1 = _mm512_min_ps(b, l1);
    }
    for (; i < n; i += 16) { /* masked-off lanes load 0, inside the range already */
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        bad |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
        h0 = _mm512_max_ps(a, h0);
        l0 = _mm512_min_ps(a, l0);
    }
    *hi_out = _mm512_reduce_max_ps(_mm512_max_ps(h0, h1));
    *lo_out = _mm512_reduce_min_ps(_mm512_min_ps(l0, l1));
    return bad != 0;
}

/* The quotient x / s rounded to an integer (ties to even) for 16 lanes, as x * (1 / s): that product lies
   within 1.5 * 2^-23 * |x / s| of the correctly rounded quotient fl(x / s) -- below 2^-12 while |x / s| <=
   1024 -- so both round to the same integer unless one is next to a half-integer; the lanes within 2^-12 of
   one (a few per thousand) are divided exactly, so the result is rint(fl(x / s)). Past 1024 the callers
   saturate either way. divide_all (qg_divide_all): a scale without a normal, finite reciprocal. */
static inline int qg_divide_all(float s) { return !(fabsf(s) >= 1.17549435e-38f && fabsf(1.0f / s) < 3.0e38f); }

static inline __attribute__((always_inline)) T512 __m512 qg_rint_quotient_512(__m512 xv, __m512 vs, __m512 rcp,
                                                                            int divide_all) {
    const __m512 magic = _mm512_set1_ps(QG_MAGIC);
    const __m512 near = _mm512_set1_ps(0.5f - 1.0f / 4096.0f); /* |q - rint(q)| above it: next to a tie */
    __m512 q = _mm512_mul_ps(xv, rcp);
    __m512 r = _mm512_sub_ps(_mm512_add_ps(q, magic), magic); /* rint(q), ties to even (|q| < 2^22) */
    const __mmask16 tie = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(q, r)), near, _CMP_GT_OQ);
    if (tie | divide_all) {
        q = divide_all ? _mm512_div_ps(xv, vs) : _mm512_mask_div_ps(q, tie, xv, vs);
        r = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    return r;
}

/* y = clip(rint(x / s) + z, 0, 255) for n values (|x / s| <= 255 here); returns the sum of the bytes written.
   The quotient by the reciprocal (a division costs ~10x a multiply), the lanes next to a tie divided
   (qg_rint_quotient_512): the bytes of the division, ONNX's rint(x / s), ties to even. */
static T512 uint32_t qg_dq_apply_512(const float *x, int64_t n, float s, float z, uint8_t *y) {
    const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(z), lo = _mm512_setzero_ps();
    const __m512 hi = _mm512_set1_ps(255.0f), rcp = _mm512_set1_ps(1.0f / s);
    const int divide_all = qg_divide_all(s);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 r = qg_rint_quotient_512(_mm512_maskz_loadu_ps(m, x + i), vs, rcp, divide_all);
        const __m512 q = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(r, vz), lo), hi);
        const __m512i v = _mm512_maskz_mov_epi32(m, _mm512_cvttps_epi32(q));
        sum = _mm512_add_epi32(sum, v);
        _mm512_mask_cvtepi32_storeu_epi8(y + i, m, v);
    }
    return (uint32_t)_mm512_reduce_add_epi32(sum);
}
#endif

/* the scale and zero point ONNX DynamicQuantizeLinear derives from the range [lo, hi] (0 inside it) */
static inline void qg_dq_params(float hi, float lo, float *s_out, float *z_out) {
    const float s = hi == lo ? 1.0f : (hi - lo) / 255.0f;
    float z = 0.0f - lo / s;
    z = z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z);
    *s_out = s;
    *z_out = (z + QG_MAGIC) - QG_MAGIC;
}

static int qg_dq_range_base(const float *x, int64_t n, float *hi, float *lo) { return qg_dq_range(x, n, hi, lo); }
static void qg_dq_apply_base(const float *x, int64_t n, float s, float z, uint8_t *y) {
    qg_dq_apply(x, n, s, z, y);
}

/* Writes y (n bytes), *scale and *zp. Returns QG_ERR_ARGS when x holds a NaN (the caller's reference
   kernel decides what that means) or n < 0. */
int opstrata_dynamic_quantize(const float *x, int64_t n, uint8_t *y, float *scale, uint8_t *zp) {
    if (n < 0) return QG_ERR_ARGS;
    float hi, lo, s, z;
#if QG_X86
    if (qg_avx512vnni()) {
        if (qg_dq_range_512(x, n, &hi, &lo)) return QG_ERR_ARGS;
        qg_dq_params(hi, lo, &s, &z);
        qg_dq_apply_512(x, n, s, z, y);
        *scale = s;
        *zp = (uint8_t)z;
        return QG_OK;
    }
#endif
    const int wide = qg_avx2();
    if (wide ? qg_dq_range_avx2(x, n, &hi, &lo) : qg_dq_range_base(x, n, &hi, &lo)) return QG_ERR_ARGS;
    qg_dq_params(hi, lo, &s, &z);
    if (wide)
        qg_dq_apply_avx2(x, n, s, z, y);
    else
        qg_dq_apply_base(x, n, s, z, y);
    *scale = s;
    *zp = (uint8_t)z;
    return QG_OK;
}

/* x (M x K float32, rows contiguous) quantized as ONNX DynamicQuantizeLinear does (per_row 0: one scale
   and zero point for all of x; 1: one per row, i.e. per token) or (per_row 2) symmetric int8 per row
   (s = max(max|x| / 127, FLT_MIN), q = rint(x / s) in [-127, 127], held as q + 128), times the packed B, with the float32
   epilogue (x_scale * b_scale, bias, ReLU) into out (M x N, row stride ldo): DynamicQuantizeLinear ->
   MatMulInteger -> Cast -> Mul (-> Add) in one call. scales / zps receive the 1 or M scales and zero
   points. Returns QG_ERR_ARGS (out untouched) when x holds a NaN. */
int opstrata_dynamic_qgemm(int path, int64_t M, int64_t N, int64_t K, const float *x, int per_row,
                           const int8_t *Bp, const int32_t *colsum, const int32_t *zbe, const float *b_scale,
                           int64_t n_b_scale, const float *bias, int relu, float *out, int64_t ldo,
                           float *scales, uint8_t *zps, int nthreads) {
    if (path < 0) path = opstrata_qgemm_best_path();
    if (path >= QG_NPATHS || !(opstrata_qgemm_paths() & (1 << path))) return QG_ERR_PATH;
    if (M < 0 || N < 0 || K < 0 || !b_scale || (n_b_scale != 1 && n_b_scale != N)) return QG_ERR_ARGS;
    const int64_t groups = per_row ? M : 1, glen = per_row ? K : M * K;
    for (int64_t g = 0; g < groups; ++g) { /* the ranges first: a NaN anywhere leaves everything untouched */
        float hi, lo;
        const float *xg = x + g * glen;
        int bad;
#if QG_X86
        if (qg_avx512vnni())
            bad = qg_dq_range_512(xg, glen, &hi, &lo);
        else
#endif
            bad = qg_avx2() ? qg_dq_range_avx2(xg, glen, &hi, &lo) : qg_dq_range_base(xg, glen, &hi, &lo);
        if (bad) return QG_ERR_ARGS;
        float s, z;
        if (per_row == 2) { /* symmetric int8 per token, held as uint8 + 128 */
            const float amax = hi > -lo ? hi : -lo, t = amax / 127.0f;
            s = t > 1.17549435e-38f ? t : 1.17549435e-38f; /* float32's smallest normal */
            z = 128.0f;
        } else {
            qg_dq_params(hi, lo, &s, &z);
        }
        scales[g] = s;
        zps[g] = (uint8_t)z;
    }
    if (M == 0 || N == 0) return QG_OK;
    if (nthreads < 1) nthreads = 1;
    const int64_t kp = qg_kpad(K);
#if QG_X86
    if ((path == QG_PATH_AMX || path == QG_PATH_AVX512VNNI || path == QG_PATH_AVXVNNI) && qg_avx512vnni()) {
        /* quantize straight into the kernels' layout (rows of kp bytes, zero padded) with the row sums */
        uint8_t *aw = (uint8_t *)malloc((size_t)(M * (kp ? kp : 1)));
        int32_t *rows = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)M);
        if (!aw || !rows) {
            free(aw);
            free(rows);
            return QG_ERR_NOMEM;
        }
        int32_t *zae = rows, *rterm = rows + M;
        for (int64_t i = 0; i < M; ++i) {
            const int64_t g = per_row ? i : 0;
            uint8_t *dst = aw + i * kp;
            const uint32_t sum = qg_dq_apply_512(x + i * K, K, scales[g], (float)zps[g], dst);
            for (int64_t k = K; k < kp; ++k) dst[k] = 0;
            zae[i] = (int32_t)zps[g];
            rterm[i] = (int32_t)(sum - (uint32_t)K * (uint32_t)zps[g]);
        }
        qg_epi e = {QG_OUT_F32, out, ldo, colsum, zbe, zae, rterm, scales, per_row != 0,
                    b_scale, n_b_scale != 1, bias, relu, 0, 0, 0, 0, 0};
        qg_epi_scan(&e, M, N);
        qg_drive(path, M, N, K, aw, kp, Bp, &e, nthreads);
        free(aw);
        free(rows);
        return QG_OK;
    }
#endif
    /* the other paths: quantize, then the general driver (which lays A out for its kernels) */
    uint8_t *q = (uint8_t *)malloc((size_t)(M * K > 0 ? M * K : 1));
    int32_t *za = (int32_t *)malloc(sizeof(int32_t) * (size_t)groups);
    if (!q || !za) {
        free(q);
        free(za);
        return QG_ERR_NOMEM;
    }
    const int wide = qg_avx2();
    for (int64_t g = 0; g < groups; ++g) {
        if (wide)
            qg_dq_apply_avx2(x + g * glen, glen, scales[g], (float)zps[g], q + g * glen);
        else
            qg_dq_apply_base(x + g * glen, glen, scales[g], (float)zps[g], q + g * glen);
        za[g] = zps[g];
    }
    const int rc = opstrata_qgemm(path, M, N, K, q, K, 0, za, groups, Bp, colsum, zbe, QG_OUT_F32, out, ldo,
                                  scales, groups, b_scale, n_b_scale, bias, relu, 0, nthreads);
    free(q);
    free(za);
    return rc;
}


/* ------------------------------------------------------------------ 2-D convolution */

/* One NCHW image's planes laid out channels-last: dst[q * ld + c] = x[c * HW + q] ^ flip for c < C, q < HW,
   and 0 for C <= c < ld (a GEMM row padded to its K groups). Blocks of 16 channels x 16 pixels go through a
   16x16 byte transpose in SSE2 registers (baseline x86-64); leftover channels and pixels byte by byte. */
#if QG_X86
static inline void qg_transpose16x16(__m128i r[16]) {
    __m128i a[16], b[16], c[16];
    for (int i = 0; i < 8; ++i) {
        a[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) { /* rows 4i..4i+3: pixel quarters 0..3 */
        b[4 * i] = _mm_unpacklo_epi16(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm_unpackhi_epi16(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm_unpacklo_epi16(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm_unpackhi_epi16(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int h = 0; h < 2; ++h) /* rows 8h..8h+7: pixel pairs */
        for (int k = 0; k < 4; ++k) {
            c[8 * h + 2 * k] = _mm_unpacklo_epi32(b[8 * h + k], b[8 * h + 4 + k]);
            c[8 * h + 2 * k + 1] = _mm_unpackhi_epi32(b[8 * h + k], b[8 * h + 4 + k]);
        }
    for (int k = 0; k < 8; ++k) { /* pixel 2k, 2k + 1: all 16 rows */
        r[2 * k] = _mm_unpacklo_epi64(c[k], c[k + 8]);
        r[2 * k + 1] = _mm_unpackhi_epi64(c[k], c[k + 8]);
    }
}
#endif

static void qg_channels_last(const uint8_t *x, int64_t C, int64_t HW, uint8_t flip, uint8_t *dst, int64_t ld) {
    int64_t c0 = 0;
#if QG_X86
    const __m128i vflip = _mm_set1_epi8((char)flip);
    for (; c0 + 16 <= C; c0 += 16) {
        int64_t q0 = 0;
        for (; q0 + 16 <= HW; q0 += 16) {
            __m128i r[16];
            for (int i = 0; i < 16; ++i)
                r[i] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(x + (c0 + i) * HW + q0)), vflip);
            qg_transpose16x16(r);
            for (int i = 0; i < 16; ++i) _mm_storeu_si128((__m128i *)(dst + (q0 + i) * ld + c0), r[i]);
        }
        for (; q0 < HW; ++q0)
            for (int64_t c = c0; c < c0 + 16; ++c) dst[q0 * ld + c] = x[c * HW + q0] ^ flip;
    }
#endif
    for (int64_t c = c0; c < C; ++c)
        for (int64_t q = 0; q < HW; ++q) dst[q * ld + c] = x[c * HW + q] ^ flip;
    if (ld > C)
        for (int64_t q = 0; q < HW; ++q) memset(dst + q * ld + C, 0, (size_t)(ld - C));
}

#if QG_X86
/* qg_rows_nchw_taps for 16 output pixels at a time: per group of 16 taps, each tap's 16 pixels as one vector
   (a 16-byte load at stride 1, the even bytes of 32 at stride 2, else byte by byte -- also where the run
   leaves the image), then a 16 x 16 byte transpose makes them 16 bytes of 16 rows. */
static void qg_rows_nchw_taps_16(const uint8_t *x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t cg,
                                 int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                                 int64_t dw, int64_t OH, int64_t OW, uint8_t flip, uint8_t pad, uint8_t *rows,
                                 int64_t kp) {
    const int64_t K = kh * kw * cg, HW = H * W, kgroups = (K + 15) / 16;
    int64_t tap_shift[1024], tap_dy[1024], tap_plane[1024]; /* iw = ow * sw + shift, ih = oh * sh - ph + dy */
    const uint8_t *tap_row[1024]; /* per output row: the tap's input row, NULL above / below the image */
    for (int64_t t = 0; t < K; ++t) {
        tap_shift[t] = t / cg % kw * dw - pw;
        tap_dy[t] = t / (kw * cg) * dh;
        tap_plane[t] = t % cg * HW;
    }
    const __m128i vflip = _mm_set1_epi8((char)flip), evens = _mm_set1_epi16(0x00FF), zero = _mm_setzero_si128();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t oh = 0; oh < OH; ++oh) {
            uint8_t *base = rows + (n * OH + oh) * OW * kp;
            for (int64_t t = 0; t < K; ++t) {
                const int64_t ih = oh * sh - ph + tap_dy[t];
                tap_row[t] = ih >= 0 && ih < H ? x + n * C * HW + tap_plane[t] + ih * W : NULL;
            }
            for (int64_t ow0 = 0; ow0 < OW; ow0 += 16) {
                const int nb = OW - ow0 < 16 ? (int)(OW - ow0) : 16;
                for (int64_t tg = 0; tg < kgroups; ++tg) {
                    __m128i v[16];
                    for (int t = 0; t < 16; ++t) {
                        const int64_t k = tg * 16 + t;
                        if (k >= K) {
                            v[t] = zero;
                            continue;
                        }
                        const int64_t iw0 = ow0 * sw + tap_shift[k];
                        const uint8_t *row = tap_row[k];
                        const int inside = row && iw0 >= 0 && iw0 + 15 * sw < W;
                        if (inside && sw == 1) {
                            v[t] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(row + iw0)), vflip);
                        } else if (inside && sw == 2 && iw0 + 32 <= W) {
                            const __m128i lo = _mm_and_si128(_mm_loadu_si128((const __m128i *)(row + iw0)), evens);
                            const __m128i hi = _mm_and_si128(_mm_loadu_si128((const __m128i *)(row + iw0 + 16)), evens);
                            v[t] = _mm_xor_si128(_mm_packus_epi16(lo, hi), vflip);
                        } else {
                            uint8_t b[16];
                            for (int q = 0; q < 16; ++q) {
                                const int64_t iw = iw0 + q * sw;
                                b[q] = q < nb && row && iw >= 0 && iw < W ? (uint8_t)(row[iw] ^ flip) : pad;
                            }
                            v[t] = _mm_loadu_si128((const __m128i *)b);
                        }
                    }
                    qg_transpose16x16(v);
                    for (int q = 0; q < nb; ++q) _mm_storeu_si128((__m128i *)(base + (ow0 + q) * kp + tg * 16), v[q]);
                }
                for (int q = 0; q < nb; ++q) /* past the tap groups: zeros up to the padded K */
                    for (int64_t o = kgroups * 16; o < kp; o += 16)
                        _mm_storeu_si128((__m128i *)(base + (ow0 + q) * kp + o), zero);
            }
        }
}
#endif

/* The GEMM rows of a convolution over NCHW planes (few channels per group: no channels-last copy), rows of kp
   bytes ordered (tap i, tap j, channel), the padding zero point pad where a tap leaves the image and 0 past
   K = kh * kw * cg. x points at the group's first plane of image 0 (images C planes apart). Loops tap by tap
   over runs of output pixels, with the in-image range of each tap computed once, so the inner loop is a
   strided byte copy. */
static void qg_rows_nchw_taps(const uint8_t *x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t cg, int64_t kh,
                              int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                              int64_t OH, int64_t OW, uint8_t flip, uint8_t pad, uint8_t *rows, int64_t kp) {
    const int64_t K = kh * kw * cg, HW = H * W;
#if QG_X86
    if (K <= kp && K <= 1024) {
        qg_rows_nchw_taps_16(x, N, C, H, W, cg, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, flip, pad, rows, kp);
        return;
    }
#endif
    for (int64_t n = 0; n < N; ++n)
        for (int64_t oh = 0; oh < OH; ++oh) {
            uint8_t *base = rows + (n * OH + oh) * OW * kp;
            for (int64_t i = 0; i < kh; ++i) {
                const int64_t ih = oh * sh - ph + i * dh;
                for (int64_t j = 0; j < kw; ++j) {
                    const int64_t shift = j * dw - pw; /* iw = ow * sw + shift */
                    int64_t lo = shift >= 0 ? 0 : (-shift + sw - 1) / sw;
                    int64_t hi = W - 1 - shift < 0 ? 0 : (W - 1 - shift) / sw + 1;
                    if (ih < 0 || ih >= H) lo = hi = 0;
                    if (hi > OW) hi = OW;
                    if (lo > hi) lo = hi;
                    const int64_t at = ih * W + shift; /* + ow * sw: the tap's input in its plane */
                    for (int64_t c = 0; c < cg; ++c) {
                        uint8_t *d = base + (i * kw + j) * cg + c;
                        const uint8_t *plane = x + (n * C + c) * HW;
                        int64_t ow = 0;
                        for (; ow < lo; ++ow) d[ow * kp] = pad;
                        for (; ow < hi; ++ow) d[ow * kp] = plane[at + ow * sw] ^ flip;
                        for (; ow < OW; ++ow) d[ow * kp] = pad;
                    }
                }
            }
            if (kp > K)
                for (int64_t ow = 0; ow < OW; ++ow) memset(base + ow * kp + K, 0, (size_t)(kp - K));
        }
}

/* rterm[r] = (sum of the first K bytes of row r) - K * za: the activation-side zero-point term of each row.
   The rows hold zeros from K up to the padded kp (<= lda), so whole 16-byte chunks are summed up to there. */
static void qg_row_terms(const uint8_t *a, int64_t lda, int64_t M, int64_t K, int64_t kp, int32_t za, int32_t *rterm) {
    const int64_t kz = (K + 15) / 16 * 16 <= kp ? (K + 15) / 16 * 16 : 0; /* chunked up to here */
    for (int64_t r = 0; r < M; ++r) {
        const uint8_t *ar = a + r * lda;
        uint64_t sum = 0;
        int64_t k = 0;
#if QG_X86
        __m128i acc = _mm_setzero_si128();
        for (; k < kz; k += 16) acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(ar + k)), _mm_setzero_si128()));
        sum = (uint64_t)_mm_cvtsi128_si64(acc) + (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc));
#endif
        for (; k < K; ++k) sum += ar[k];
        rterm[r] = (int32_t)((uint32_t)sum - (uint32_t)K * (uint32_t)za);
    }
}

/* The patch rows of images [n0, n1) from the channels-last images xh (row stride C): per output pixel kh * kw
   runs of cg channels (the zero point where a tap leaves the image), then zeros up to kp. */
static void qg_rows_channels_last(const uint8_t *xh, int64_t n0, int64_t n1, int64_t C, int64_t H, int64_t W,
                                  int64_t cg, int64_t g, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                                  int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW,
                                  int32_t za, uint8_t *rows, int64_t kp) {
    const int64_t img = H * W * C, K = kh * kw * cg;
    for (int64_t n = n0; n < n1; ++n)
        for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow) {
                uint8_t *dst = rows + ((n * OH + oh) * OW + ow) * kp;
                const uint8_t *src = xh + n * img + g * cg;
                const int64_t iw0 = ow * sw - pw;
                const int whole_rows = groups == 1 && dw == 1 && iw0 >= 0 && iw0 + kw <= W;
                for (int64_t i = 0; i < kh; ++i) {
                    const int64_t ih = oh * sh - ph + i * dh;
                    if (ih < 0 || ih >= H) { /* a kernel row above or below the image */
                        memset(dst, (int)za, (size_t)(kw * cg));
                        dst += kw * cg;
                        continue;
                    }
                    if (whole_rows) { /* kw taps of all channels: one contiguous channels-last run */
                        memcpy(dst, src + (ih * W + iw0) * C, (size_t)(kw * C));
                        dst += kw * C;
                        continue;
                    }
                    for (int64_t j = 0; j < kw; ++j, dst += cg) {
                        const int64_t iw = ow * sw - pw + j * dw;
                        if (iw < 0 || iw >= W)
                            memset(dst, (int)za, (size_t)cg);
                        else
                            memcpy(dst, src + (ih * W + iw) * C, (size_t)cg);
                    }
                }
                memset(dst, 0, (size_t)(kp - K));
            }
}

/* one thread's share of a convolution's GEMM operand: images [n0, n1) laid out channels-last (transpose:
   group 0 only, the copy serves every group), their patch rows for group g (unless direct) and row sums */
typedef struct {
    const uint8_t *x;
    uint8_t *xh, *rows;
    int32_t *rterm;
    int64_t C, H, W, cg, g, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, K, kp, ldh;
    int32_t za;
    uint8_t flip;
    int direct, nchw_taps, transpose;
    int64_t n0, n1;
} qg_prep_job;

static void qg_prep_run(const void *p) {
    const qg_prep_job *j = (const qg_prep_job *)p;
    const int64_t HW = j->H * j->W, img = HW * j->C, P = j->OH * j->OW, groups = j->C / j->cg;
    for (int64_t n = j->n0; n < j->n1 && j->transpose; ++n) /* channels-last: xh[n][(h * W + w) * ldh + c] */
        qg_channels_last(j->x + n * img, j->C, HW, j->flip, j->xh + n * HW * j->ldh, j->ldh);
    if (j->nchw_taps) /* a few channels per group (the RGB stem): tap by tap, a run of output pixels each */
        qg_rows_nchw_taps(j->x + j->n0 * img + j->g * j->cg * HW, j->n1 - j->n0, j->C, j->H, j->W, j->cg, j->kh, j->kw,
                          j->sh, j->sw, j->ph, j->pw, j->dh, j->dw, j->OH, j->OW, j->flip, (uint8_t)j->za,
                          j->rows + j->n0 * P * j->kp, j->kp);
    else if (!j->direct)
        qg_rows_channels_last(j->xh, j->n0, j->n1, j->C, j->H, j->W, j->cg, j->g, groups, j->kh, j->kw, j->sh, j->sw,
                              j->ph, j->pw, j->dh, j->dw, j->OH, j->OW, j->za, j->rows, j->kp);
    const uint8_t *a = j->direct ? j->xh : j->rows;
    const int64_t lda = j->direct ? j->ldh : j->kp;
    qg_row_terms(a + j->n0 * P * lda, lda, (j->n1 - j->n0) * P, j->K, j->kp, j->za, j->rterm + j->n0 * P);
}

/* x (N, C, H, W) int8/uint8 NCHW (x_signed: int8, moved to uint8 by + 128 with its zero point) convolved
   with a weight packed per group as a (kh * kw * C/g, OC/g) GEMM operand (rows ordered tap-major: (i, j, c)),
   scaled per output channel (scale) + bias, into out (N, OC, OH, OW) float32. Each image is laid out
   channels-last once; each group's rows (one per output pixel, kh * kw runs of C/g bytes, the zero point
   where the window leaves the image) then go through the int8 GEMM, whose epilogue writes NCHW. A 1x1,
   stride-1, unpadded convolution of one group multiplies the channels-last image directly. */
int opstrata_qconv2d(int path, int64_t N, int64_t C, int64_t H, int64_t W, const uint8_t *x, int x_signed,
                     int32_t x_zp, int64_t OC, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                     int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW, int64_t groups,
                     const int8_t *const *Bp, const int32_t *const *colsum, const int32_t *const *zbe,
                     const float *scale, int64_t n_scale, const float *bias, float *out, int nthreads) {
    if (path < 0) path = opstrata_qgemm_best_path();
    if (path >= QG_NPATHS || !(opstrata_qgemm_paths() & (1 << path))) return QG_ERR_PATH;
    if (N < 0 || C < 1 || H < 0 || W < 0 || OC < 1 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 ||
        dw < 1 || OH < 0 || OW < 0 || groups < 1 || C % groups || OC % groups || (n_scale != 1 && n_scale != OC))
        return QG_ERR_ARGS;
    if (N == 0 || OH == 0 || OW == 0) return QG_OK;
    if (nthreads < 1) nthreads = 1;
    const int64_t cg = C / groups, ocg = OC / groups, K = kh * kw * cg, kp = qg_kpad(K), P = OH * OW, M = N * P;
    const uint8_t flip = x_signed ? 0x80 : 0;
    const int32_t za = x_zp + (x_signed ? 128 : 0);
    /* a 1x1, stride-1, unpadded convolution of one group multiplies the channels-last image directly, its
       rows padded to the K groups (kp) where C is not a multiple of them */
    const int direct = groups == 1 && kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 &&
                       dh == 1 && dw == 1 && OH == H && OW == W && path != QG_PATH_AVX2;
    const int64_t img = H * W * C, ldh = direct ? kp : C; /* channels-last row stride */
    /* a few channels per group (the RGB stem): the patches read the NCHW image tap by tap, no channels-last
       copy (a byte-wise transpose of the whole image cost more than the convolution) */
    const int nchw_taps = !direct && cg < 16;
    uint8_t *xh = nchw_taps ? NULL : (uint8_t *)malloc((size_t)(N * H * W * ldh > 0 ? N * H * W * ldh : 1));
    uint8_t *rows = direct ? NULL : (uint8_t *)malloc((size_t)(M * kp));
    int32_t *rt = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)M);
    uint16_t *a16 = path == QG_PATH_AVX2 ? (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(M * kp)) : NULL;
    if ((!nchw_taps && !xh) || (!direct && !rows) || !rt || (path == QG_PATH_AVX2 && !a16)) {
        free(xh);
        free(rows);
        free(rt);
        free(a16);
        return QG_ERR_NOMEM;
    }
    int32_t *zae = rt, *rterm = rt + M;
    for (int64_t i = 0; i < M; ++i) zae[i] = za;
    /* the GEMM operand's preparation -- channels-last copies, patch rows, row sums -- split by images over
       the threads (each image's rows read only that image), then the GEMM over all of them */
    int prep_threads = nthreads < N ? nthreads : (int)N;
    if (prep_threads > 64) prep_threads = 64;
    if ((M * K) >> 17 < prep_threads) prep_threads = (M * K) >> 17 > 1 ? (int)((M * K) >> 17) : 1;
    const float one = 1.0f;
    for (int64_t g = 0; g < groups; ++g) {
        qg_prep_job jobs[64];
        for (int t = 0; t < prep_threads; ++t)
            jobs[t] = (qg_prep_job){x, xh, rows, rterm, C, H, W, cg, g, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, K, kp,
                                    ldh, za, flip, direct, nchw_taps, g == 0 && !nchw_taps, N * t / prep_threads,
                                    N * (t + 1) / prep_threads};
        if (prep_threads == 1)
            qg_prep_run(&jobs[0]);
        else
            qg_parallel(qg_prep_run, jobs, sizeof(qg_prep_job), prep_threads);
        const uint8_t *a = direct ? xh : rows;
        const int64_t lda = direct ? ldh : kp;
        const float *sg = n_scale == 1 ? scale : scale + g * ocg;
        qg_epi e = {QG_OUT_F32, out + g * ocg * P, 1, colsum[g], zbe[g], zae, rterm, &one, 0, sg, n_scale != 1,
                    bias ? bias + g * ocg : NULL, 0, 0, P, OC * P, 0, 0};
        qg_epi_scan(&e, M, ocg);
        if (a16) { /* the AVX2 kernel broadcasts rows widened to u16 */
            for (int64_t r = 0; r < M; ++r)
                for (int64_t k = 0; k < kp; ++k) a16[r * kp + k] = a[r * lda + k];
            qg_drive(path, M, ocg, K, (const uint8_t *)a16, 2 * kp, Bp[g], &e, nthreads);
        } else {
            qg_drive(path, M, ocg, K, a, lda, Bp[g], &e, nthreads);
        }
    }
    free(xh);
    free(rows);
    free(rt);
    free(a16);
    return QG_OK;
}

/* depthwise 2-D convolution (groups == C == OC), channels-last: the image centred by its zero point into
   an int16 (Hp, Wp, C) buffer padded with zeros, then per output pixel and tap a multiply-add of C int16
   pairs into int32 accumulators (the channel loop vectorises), scaled per channel into NCHW float32. Exact.
   wc: the weight centred by its zero point, (C, kh * kw) int16. Threads split images x output rows.
   opstrata_qconv2d_depthwise runs it where the float32 kernels below do not (more than QG_DW_EXACT_TAPS
   taps, no AVX-512, `path` portable / AVX2, or wcf / wl NULL); wcf and wl, the same weight as float32
   ((C, kh * kw), and in blocks of 16 channels: PackedConv.centred_f32 / centred_lanes), feed those. */
typedef struct {
    int64_t C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, Hp, Wp;
    const uint8_t *x;
    uint8_t flip;
    int32_t za;
    const int16_t *wt; /* (kh * kw, C): tap-major */
    const float *scale;
    int64_t n_scale;
    const float *bias;
    float *out;
    const int16_t *xp; /* (N, Hp, Wp, C) */
    int64_t r0, r1;    /* output rows (n * OH + oh) of this worker */
    int path;          /* QG_PATH_* or -1 (see qg_dw_rows) */
} qg_dw_job;

static inline __attribute__((always_inline)) void qg_dw_rows_body(const qg_dw_job *j) {
    const int64_t C = j->C, P = j->OH * j->OW;
    int32_t *acc = (int32_t *)malloc(sizeof(int32_t) * (size_t)C);
    float *sc = (float *)malloc(sizeof(float) * (size_t)C);
    if (!acc || !sc) {
        free(acc);
        free(sc);
        return; /* checked by the caller's probe allocation */
    }
    for (int64_t c = 0; c < C; ++c) sc[c] = j->scale[j->n_scale == 1 ? 0 : c];
    for (int64_t r = j->r0; r < j->r1; ++r) {
        const int64_t n = r / j->OH, oh = r % j->OH;
        const int16_t *xn = j->xp + n * j->Hp * j->Wp * C;
        float *on = j->out + n * C * P + oh * j->OW;
        for (int64_t ow = 0; ow < j->OW; ++ow) {
            for (int64_t c = 0; c < C; ++c) acc[c] = 0;
            for (int64_t i = 0; i < j->kh; ++i)
                for (int64_t t = 0; t < j->kw; ++t) {
                    const int16_t *src = xn + ((oh * j->sh + i * j->dh) * j->Wp + ow * j->sw + t * j->dw) * C;
                    const int16_t *wv = j->wt + (i * j->kw + t) * C;
                    for (int64_t c = 0; c < C; ++c) acc[c] += (int32_t)src[c] * (int32_t)wv[c];
                }
            for (int64_t c = 0; c < C; ++c)
                on[c * P + ow] = (float)acc[c] * sc[c] + (j->bias ? j->bias[c] : 0.0f);
        }
    }
    free(acc);
    free(sc);
}

/* the channel loops vectorise with the widest ISA this CPU has */
#if QG_X86
/* AVX-512: 16 channels' accumulators stay in a register across all taps of one output pixel */
static T512 void qg_dw_rows_512(const qg_dw_job *j) {
    const int64_t C = j->C, P = j->OH * j->OW, tstep = j->dw * C; /* int16 elements between taps */
    for (int64_t r = j->r0; r < j->r1; ++r) {
        const int64_t n = r / j->OH, oh = r % j->OH;
        const int16_t *xn = j->xp + n * j->Hp * j->Wp * C;
        float *on = j->out + n * C * P + oh * j->OW;
        for (int64_t ow = 0; ow < j->OW; ++ow) {
            for (int64_t c = 0; c < C; c += 16) {
                const __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c)) - 1u);
                __m512i acc0 = _mm512_setzero_si512(), acc1 = acc0; /* two chains: the adds overlap */
                const int16_t *wp = j->wt + c;
                for (int64_t i = 0; i < j->kh; ++i) {
                    const int16_t *src = xn + ((oh * j->sh + i * j->dh) * j->Wp + ow * j->sw) * C + c;
                    int64_t t = 0;
                    for (; t + 1 < j->kw; t += 2, src += tstep * 2, wp += 2 * C) {
                        const __m512i x0 = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, src));
                        const __m512i x1 = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, src + tstep));
                        const __m512i w0 = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, wp));
                        const __m512i w1 = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, wp + C));
                        acc0 = _mm512_add_epi32(acc0, _mm512_mullo_epi32(x0, w0));
                        acc1 = _mm512_add_epi32(acc1, _mm512_mullo_epi32(x1, w1));
                    }
                    for (; t < j->kw; ++t, src += tstep, wp += C) {
                        const __m512i x0 = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, src));
                        const __m512i w0 = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(m, wp));
                        acc0 = _mm512_add_epi32(acc0, _mm512_mullo_epi32(x0, w0));
                    }
                }
                __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(acc0, acc1));
                const __m512 sc = j->n_scale == 1 ? _mm512_set1_ps(j->scale[0]) : _mm512_maskz_loadu_ps(m, j->scale + c);
                v = _mm512_mul_ps(v, sc);
                if (j->bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, j->bias + c));
                float lanes[16];
                _mm512_storeu_ps(lanes, v);
                const int nl = C - c < 16 ? (int)(C - c) : 16;
                for (int l = 0; l < nl; ++l) on[(c + l) * P + ow] = lanes[l];
            }
        }
    }
}
static __attribute__((target("avx2"))) void qg_dw_rows_avx2(const qg_dw_job *j) { qg_dw_rows_body(j); }
#endif

#if QG_X86
/* Depthwise by planes (AVX-512; output rows of at least QG_DW_LANES_MAX_OW columns): each channel plane is
   centred and converted to float32 into a zero-padded scratch split into sw column phases (phase q holds
   the padded columns q, q + sw, ...: every tap of 16 consecutive outputs is one unaligned load, at any
   stride), then each output row 16 columns at a time sums its taps by FMA in float32 -- exactly: every
   product and partial sum is an integer below 2^24 (|x - zx|, |w - zw| <= 255, at most QG_DW_EXACT_TAPS
   taps) -- and is scaled and biased as the channels-last kernel does (one multiply, then one add): the
   same bits, without the channels-last copy of the image (a scalar transpose) or a 32-bit integer multiply
   per tap. */
#define QG_DW_EXACT_TAPS 258
#define QG_DW_LANES_MAX_OW 16 /* narrower planes: channels in lanes (qg_dw_lanes) */
typedef struct {
    int64_t C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, hp, cols, wq;
    const uint8_t *x;
    uint8_t flip;
    int32_t za;
    const float *wf;     /* (C, kh * kw) centred weights as float32 */
    const int64_t *tap;  /* each tap's offset in the phase-split scratch */
    const float *scale;
    int64_t n_scale;
    const float *bias;
    float *out;
    float *pad;          /* this worker's scratch plane: sw * hp * wq floats */
    int64_t p0, p1;      /* planes (n * C + c) of this worker */
} qg_dwp_job;

/* the output rows of one plane from its phase-split scratch: 16 columns at a time, the taps summed in
   order by FMA from 0 (exact), then one multiply by the scale and one add of the bias */
static T512 inline __attribute__((always_inline)) void qg_dwp_rows(const float *pad, const int64_t *tap, const float *wk,
                                                                 float scale, const float *bias, float *op, int64_t OH,
                                                                 int64_t OW, int64_t sh, int64_t wq, int64_t taps) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t oh = 0; oh < OH; ++oh) {
        const float *base = pad + oh * sh * wq;
        for (int64_t ow = 0; ow < OW; ow += 16) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t k = 0; k < taps; ++k)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(wk[k]), _mm512_loadu_ps(base + tap[k] + ow), acc);
            __m512 v = _mm512_mul_ps(acc, sc);
            if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(*bias));
            const __mmask16 m = OW - ow >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (OW - ow)) - 1u);
            _mm512_mask_storeu_ps(op + oh * OW + ow, m, v);
        }
    }
}

static T512 void qg_dw_planes_512(const qg_dwp_job *j) {
    const int64_t C = j->C, H = j->H, W = j->W, sw = j->sw, hp = j->hp, cols = j->cols, wq = j->wq;
    const int64_t OH = j->OH, OW = j->OW, taps = j->kh * j->kw;
    const __m128i flip = _mm_set1_epi8((char)j->flip);
    const __m512i za = _mm512_set1_epi32(j->za), flip32 = _mm512_set1_epi32(j->flip);
    float *pad = j->pad;
    for (int64_t p = j->p0; p < j->p1; ++p) {
        const int64_t c = p % C;
        const uint8_t *xp = j->x + p * H * W;
        memset(pad, 0, sizeof(float) * (size_t)(sw * hp * wq));
        for (int64_t q = 0; q < sw; ++q) {
            /* phase column t holds padded column t * sw + q, i.e. input column t * sw + q - pw */
            const int64_t t0 = j->pw - q > 0 ? (j->pw - q + sw - 1) / sw : 0;
            int64_t t1 = W - 1 + j->pw - q >= 0 ? (W - 1 + j->pw - q) / sw + 1 : 0;
            if (t1 > cols) t1 = cols;
            if (t0 >= t1) continue;
            for (int64_t r = 0; r < hp; ++r) {
                const int64_t ih = r - j->ph;
                if (ih < 0 || ih >= H) continue;
                const uint8_t *src = xp + ih * W + q - j->pw;
                float *dst = pad + (q * hp + r) * wq;
                if (sw == 1) {
                    for (int64_t t = t0; t < t1; t += 16) {
                        const __mmask16 m = t1 - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t1 - t)) - 1u);
                        const __m128i b = _mm_xor_si128(_mm_maskz_loadu_epi8(m, src + t), flip);
                        const __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(b), za);
                        _mm512_mask_storeu_ps(dst + t, m, _mm512_cvtepi32_ps(v));
                    }
                } else if (sw == 2) { /* the even bytes of 16 words: each word zero-extended, its low byte kept */
                    const __m512i lo = _mm512_set1_epi32(0xFF);
                    for (int64_t t = t0; t < t1; t += 16) {
                        const int64_t n = t1 - t >= 16 ? 16 : t1 - t;
                        const __mmask32 mb = (__mmask32)((1ull << (2 * n - 1)) - 1ull);
                        const __m256i w = _mm256_maskz_loadu_epi8(mb, src + 2 * t);
                        const __m512i b = _mm512_and_si512(_mm512_cvtepu16_epi32(w), lo);
                        const __m512i v = _mm512_sub_epi32(_mm512_and_si512(_mm512_xor_si512(b, flip32), lo), za);
                        _mm512_mask_storeu_ps(dst + t, (__mmask16)((1u << n) - 1u), _mm512_cvtepi32_ps(v));
                    }
                } else {
                    for (int64_t t = t0; t < t1; ++t)
                        dst[t] = (float)((int32_t)(uint8_t)(src[t * sw] ^ j->flip) - j->za);
                }
            }
        }
        const float *wk = j->wf + c * taps;
        const float sc = j->scale[j->n_scale == 1 ? 0 : c];
        float *op = j->out + p * OH * OW;
        if (taps == 9) /* constant tap counts unroll, the filter stays in registers */
            qg_dwp_rows(pad, j->tap, wk, sc, j->bias ? j->bias + c : NULL, op, OH, OW, j->sh, wq, 9);
        else if (taps == 25)
            qg_dwp_rows(pad, j->tap, wk, sc, j->bias ? j->bias + c : NULL, op, OH, OW, j->sh, wq, 25);
        else
            qg_dwp_rows(pad, j->tap, wk, sc, j->bias ? j->bias + c : NULL, op, OH, OW, j->sh, wq, taps);
    }
}
static void qg_dwp_job_run(const void *j) { qg_dw_planes_512((const qg_dwp_job *)j); }

/* Depthwise with 16 channels in the lanes of a vector (AVX-512; planes narrower than 16 columns, where a row
   would fill part of a vector): per (image, block of 16 channels), the block's pixels -- 16 x 16 bytes of
   its planes transposed at a time -- centred and converted to float32 into a zero-padded pixel-major
   scratch, the taps one vector each; every output the taps' FMA chain in float32 from 0 (exact, as the
   plane kernel), one multiply by the scales, one add of the biases; 16 outputs transposed back to the NCHW
   planes at a time. */
typedef struct {
    int64_t C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, hp, wp;
    const uint8_t *x;
    uint8_t flip;
    int32_t za;
    const float *wl; /* centred weights as float32 in blocks of 16 channels, (blocks, kh * kw, 16) zero-padded */
    const float *scale;
    int64_t n_scale;
    const float *bias;
    float *out;
    float *scratch; /* this worker's: hp * wp * 16 floats */
    int64_t i0, i1; /* items (n * blocks + block) of this worker */
} qg_dwl_job;

static T512 void qg_dw_lanes_512(const qg_dwl_job *j) {
    const int64_t C = j->C, H = j->H, W = j->W, pix = H * W, OH = j->OH, OW = j->OW, opix = OH * OW;
    const int64_t kh = j->kh, kw = j->kw, taps = kh * kw, hp = j->hp, wp = j->wp, blocks = (C + 15) / 16;
    /* locals, not j's fields: for the compiler the stores below may write those */
    const int64_t sh = j->sh, sw = j->sw, dh = j->dh, dw = j->dw, ph = j->ph, pw = j->pw;
    const uint8_t *x = j->x;
    const float *wl = j->wl, *bias = j->bias, *scale = j->scale;
    const int one_scale = j->n_scale == 1;
    float *out = j->out;
    float *xt = j->scratch;
    const __m128i flip8 = _mm_set1_epi8((char)j->flip);
    const __m512i za = _mm512_set1_epi32(j->za);
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t item = j->i0; item < j->i1; ++item) {
        const int64_t img = item / blocks, c0 = (item % blocks) * 16, cn = C - c0 < 16 ? C - c0 : 16;
        const __mmask16 m = (__mmask16)(cn == 16 ? 0xFFFF : (1u << cn) - 1u);
        const uint8_t *xb = x + (img * C + c0) * pix; /* the block's first plane */
        /* the padded scratch: zeros where the taps read outside the image ... */
        for (int64_t r = 0; r < hp; ++r) {
            const int64_t ih = r - ph;
            for (int64_t q = 0; q < wp; ++q)
                if (ih < 0 || ih >= H || q < pw || q - pw >= W) _mm512_store_ps(xt + (r * wp + q) * 16, zero);
        }
        /* ... and the image, 16 pixels of the block's planes at a time: 16 x 16 bytes transposed to one
           vector of channels per pixel, centred by the zero point as float32 (lanes past C: 0) */
        int64_t ih = 0, iw = 0;
        for (int64_t q0 = 0; q0 < pix; q0 += 16) {
            const int nq = pix - q0 < 16 ? (int)(pix - q0) : 16;
            const __mmask16 qm = (__mmask16)(nq == 16 ? 0xFFFF : (1u << nq) - 1u);
            __m128i b[16];
            for (int l = 0; l < 16; ++l)
                b[l] = l < cn ? _mm_xor_si128(_mm_maskz_loadu_epi8(qm, xb + l * pix + q0), flip8) : _mm_setzero_si128();
            qg_transpose16x16(b);
            for (int i = 0; i < nq; ++i) {
                if (ih + ph < hp && iw + pw < wp) {
                    const __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(b[i]), za);
                    _mm512_store_ps(xt + ((ih + ph) * wp + iw + pw) * 16, _mm512_maskz_cvtepi32_ps(m, v));
                }
                if (++iw == W) {
                    iw = 0;
                    ++ih;
                }
            }
        }
        const float *wb = wl + (c0 / 16) * taps * 16; /* the block's taps, one vector each */
        const __m512 sc = one_scale ? _mm512_set1_ps(scale[0]) : _mm512_maskz_loadu_ps(m, scale + c0);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + c0) : zero;
        float *oc = out + (img * C + c0) * opix;
        /* 16 output pixels at a time, then transposed: one store of 16 pixels per channel plane */
        int64_t oh = 0, ow = 0;
        for (int64_t o0 = 0; o0 < opix; o0 += 16) {
            const int no = opix - o0 < 16 ? (int)(opix - o0) : 16;
            const __mmask16 om = (__mmask16)(no == 16 ? 0xFFFF : (1u << no) - 1u);
            __m512i t[16];
            for (int i = no; i < 16; ++i) t[i] = _mm512_setzero_si512();
            for (int i0 = 0; i0 < no; i0 += 4) { /* four outputs' chains interleaved (each in its own order) */
                const float *at[4];
                for (int k = 0; k < 4; ++k) {
                    at[k] = xt + (oh * sh * wp + ow * sw) * 16; /* past no: a valid pixel, its result unused */
                    if (i0 + k < no && ++ow == OW) {
                        ow = 0;
                        if (++oh == OH) oh = 0;
                    }
                }
                __m512 acc0 = zero, acc1 = zero, acc2 = zero, acc3 = zero;
                for (int64_t a = 0; a < kh; ++a) {
                    const int64_t dy = a * dh * wp * 16;
                    const float *wr = wb + a * kw * 16;
                    for (int64_t u = 0; u < kw; ++u) {
                        const __m512 wv = _mm512_loadu_ps(wr + u * 16);
                        const int64_t d = dy + u * dw * 16;
                        acc0 = _mm512_fmadd_ps(wv, _mm512_load_ps(at[0] + d), acc0);
                        acc1 = _mm512_fmadd_ps(wv, _mm512_load_ps(at[1] + d), acc1);
                        acc2 = _mm512_fmadd_ps(wv, _mm512_load_ps(at[2] + d), acc2);
                        acc3 = _mm512_fmadd_ps(wv, _mm512_load_ps(at[3] + d), acc3);
                    }
                }
                const __m512 accs[4] = {acc0, acc1, acc2, acc3};
                for (int k = 0; k < 4 && i0 + k < no; ++k) {
                    __m512 v = _mm512_mul_ps(accs[k], sc);
                    if (bias) v = _mm512_add_ps(v, bv);
                    t[i0 + k] = _mm512_castps_si512(v);
                }
            }
            qg_transpose16_epi32(t);
            for (int64_t l = 0; l < cn; ++l) _mm512_mask_storeu_ps(oc + l * opix + o0, om, _mm512_castsi512_ps(t[l]));
        }
    }
}
static void qg_dwl_job_run(const void *j) { qg_dw_lanes_512((const qg_dwl_job *)j); }

/* the threads `items` items of `macs` multiply-adds in all split over: at most nthreads (and 64), each with
   ~256K multiply-adds at least */
static int qg_dw_threads(int64_t macs, int64_t items, int nthreads) {
    const int64_t by_work = macs >> 18;
    if (nthreads > by_work) nthreads = by_work > 1 ? (int)by_work : 1;
    if (nthreads > items) nthreads = (int)items;
    if (nthreads > 64) nthreads = 64;
    return nthreads < 1 ? 1 : nthreads;
}

/* the channels-in-lanes kernel for checked arguments (hp, wp: the padded extent the taps read) */
static int qg_dw_lanes(int64_t N, int64_t C, int64_t H, int64_t W, const uint8_t *x, int x_signed, int32_t x_zp,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                       int64_t OH, int64_t OW, const float *wl, const float *scale, int64_t n_scale, const float *bias,
                       float *out, int nthreads, int64_t hp, int64_t wp) {
    const int64_t items = N * ((C + 15) / 16);
    nthreads = qg_dw_threads(items * 16 * OH * OW * kh * kw, items, nthreads);
    const size_t scratch = (size_t)(hp * wp * 16);
    /* 64-byte aligned (each worker's part too: scratch is a multiple of 16 floats): every vector of the
       scratch a whole cache line */
    float *scr = (float *)aligned_alloc(64, sizeof(float) * scratch * (size_t)nthreads);
    if (!scr) return QG_ERR_NOMEM;
    qg_dwl_job jobs[64];
    for (int t = 0; t < nthreads; ++t)
        jobs[t] = (qg_dwl_job){C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, hp, wp, x,
                               (uint8_t)(x_signed ? 0x80 : 0), x_zp + (x_signed ? 128 : 0), wl, scale, n_scale, bias,
                               out, scr + scratch * (size_t)t, items * t / nthreads,
                               items * (t + 1) / nthreads};
    if (nthreads == 1)
        qg_dw_lanes_512(&jobs[0]);
    else
        qg_parallel(qg_dwl_job_run, jobs, sizeof(qg_dwl_job), nthreads);
    free(scr);
    return QG_OK;
}

/* the float32 kernels for checked arguments (wf: the centred weights (C, kh * kw), wl: the same in blocks
   of 16 channels): planes narrower than QG_DW_LANES_MAX_OW in lanes, the others plane by plane;
   QG_ERR_NOMEM when a scratch cannot be allocated */
static int qg_dw_planes(int64_t N, int64_t C, int64_t H, int64_t W, const uint8_t *x, int x_signed, int32_t x_zp,
                        int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                        int64_t dw, int64_t OH, int64_t OW, const float *wf, const float *wl, const float *scale,
                        int64_t n_scale, const float *bias, float *out, int nthreads) {
    const int64_t taps = kh * kw, planes = N * C;
    const int64_t hp = (OH - 1) * sh + (kh - 1) * dh + 1, wp = (OW - 1) * sw + (kw - 1) * dw + 1;
    const int64_t cols = (wp + sw - 1) / sw, wq = cols + 16; /* + a vector of slack for the last partial one */
    if (OW < QG_DW_LANES_MAX_OW && 16 * H * W <= INT32_MAX && 16 * taps <= INT32_MAX && 16 * OH * OW <= INT32_MAX)
        return qg_dw_lanes(N, C, H, W, x, x_signed, x_zp, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, wl, scale, n_scale,
                           bias, out, nthreads, hp, wp);
    nthreads = qg_dw_threads(planes * OH * OW * taps, planes, nthreads);
    const size_t scratch = (size_t)(sw * hp * wq);
    int64_t *tap = (int64_t *)malloc(sizeof(int64_t) * (size_t)taps);
    float *pads = (float *)malloc(sizeof(float) * scratch * (size_t)nthreads);
    if (!tap || !pads) {
        free(tap);
        free(pads);
        return QG_ERR_NOMEM;
    }
    for (int64_t i = 0; i < kh; ++i) /* where tap (i, t) of output (0, 0) sits in the phase-split scratch */
        for (int64_t t = 0; t < kw; ++t) tap[i * kw + t] = (((t * dw) % sw) * hp + i * dh) * wq + (t * dw) / sw;
    qg_dwp_job jobs[64];
    for (int t = 0; t < nthreads; ++t) {
        jobs[t] = (qg_dwp_job){C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, hp, cols, wq, x,
                               (uint8_t)(x_signed ? 0x80 : 0), x_zp + (x_signed ? 128 : 0), wf, tap, scale,
                               n_scale, bias, out, pads + scratch * (size_t)t, planes * t / nthreads,
                               planes * (t + 1) / nthreads};
    }
    if (nthreads == 1)
        qg_dw_planes_512(&jobs[0]);
    else
        qg_parallel(qg_dwp_job_run, jobs, sizeof(qg_dwp_job), nthreads);
    free(tap);
    free(pads);
    return QG_OK;
}
#endif
static void qg_dw_rows_base(const qg_dw_job *j) { qg_dw_rows_body(j); }

/* the channels-last rows on `path` (-1: the widest this CPU has; AVX-VNNI, AVX-512 VNNI and AMX: AVX-512
   where present) */
static void qg_dw_rows(const qg_dw_job *j, int path) {
#if QG_X86
    if (path == QG_PATH_PORTABLE) {
        qg_dw_rows_base(j);
        return;
    }
    if (qg_avx512vnni() && path != QG_PATH_AVX2) {
        qg_dw_rows_512(j);
        return;
    }
    if (qg_avx2()) {
        qg_dw_rows_avx2(j);
        return;
    }
#endif
    qg_dw_rows_base(j);
}

static void qg_dw_job_run(const void *j) { qg_dw_rows((const qg_dw_job *)j, ((const qg_dw_job *)j)->path); }

int opstrata_qconv2d_depthwise(int path, int64_t N, int64_t C, int64_t H, int64_t W, const uint8_t *x, int x_signed,
                               int32_t x_zp, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                               int64_t pw, int64_t dh, int64_t dw, int64_t OH, int64_t OW, const int16_t *wc,
                               const float *wcf, const float *wl, const float *scale, int64_t n_scale,
                               const float *bias, float *out, int nthreads) {
    if (N < 0 || C < 1 || H < 0 || W < 0 || kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 ||
        OH < 0 || OW < 0 || ph < 0 || pw < 0 || (n_scale != 1 && n_scale != C))
        return QG_ERR_ARGS;
    if (path >= QG_NPATHS || (path >= 0 && !(opstrata_qgemm_paths() & (1 << path)))) return QG_ERR_PATH;
    if (N == 0 || OH == 0 || OW == 0) return QG_OK;
#if QG_X86
    if (wcf && wl && kh * kw <= QG_DW_EXACT_TAPS && qg_avx512vnni() && (path < 0 || path >= QG_PATH_AVX512VNNI))
        return qg_dw_planes(N, C, H, W, x, x_signed, x_zp, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, wcf, wl, scale,
                            n_scale, bias, out, nthreads);
#endif
    /* the padded image covers every tap of every output position (and the whole input) */
    int64_t Hp = (OH - 1) * sh + (kh - 1) * dh + 1, Wp = (OW - 1) * sw + (kw - 1) * dw + 1;
    if (Hp < H + ph) Hp = H + ph;
    if (Wp < W + pw) Wp = W + pw;
    const int64_t taps = kh * kw;
    int16_t *xp = (int16_t *)calloc((size_t)(N * Hp * Wp * C), sizeof(int16_t));
    int16_t *wt = (int16_t *)malloc(sizeof(int16_t) * (size_t)(taps * C));
    void *probe = malloc((sizeof(int32_t) + sizeof(float)) * (size_t)C);
    if (!xp || !wt || !probe) {
        free(xp);
        free(wt);
        free(probe);
        return QG_ERR_NOMEM;
    }
    free(probe);
    for (int64_t c = 0; c < C; ++c)
        for (int64_t t = 0; t < taps; ++t) wt[t * C + c] = wc[c * taps + t];
    const uint8_t flip = x_signed ? 0x80 : 0;
    const int32_t za = x_zp + (x_signed ? 128 : 0);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < C; ++c) {
            const uint8_t *xc = x + (n * C + c) * H * W;
            int16_t *dn = xp + n * Hp * Wp * C + c;
            for (int64_t h = 0; h < H; ++h)
                for (int64_t w = 0; w < W; ++w)
                    dn[((h + ph) * Wp + w + pw) * C] = (int16_t)((int32_t)(uint8_t)(xc[h * W + w] ^ flip) - za);
        }
    qg_dw_job base = {C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, Hp, Wp, x, flip, za, wt, scale, n_scale,
                      bias, out, xp, 0, N * OH, path};
    const int64_t rows = N * OH;
    int64_t by_work = (rows * OW * C * taps) >> 20; /* ~1M multiply-adds per thread at least */
    if (nthreads > by_work) nthreads = by_work > 1 ? (int)by_work : 1;
    if (nthreads > rows) nthreads = (int)rows;
    if (nthreads > 64) nthreads = 64;
    if (nthreads <= 1) {
        qg_dw_rows(&base, path);
    } else {
        qg_dw_job jobs[64];
        for (int t = 0; t < nthreads; ++t) {
            jobs[t] = base;
            jobs[t].r0 = rows * t / nthreads;
            jobs[t].r1 = rows * (t + 1) / nthreads;
        }
        qg_parallel(qg_dw_job_run, jobs, sizeof(qg_dw_job), nthreads);
    }
    free(xp);
    free(wt);
    return QG_OK;
}

/* The activations applied before a quantization (QConvQuantize's epilogue), step by step as numpy and ops'
   elementwise code compute them in float32, NaN kept: relu max(x, 0); hardswish min(max(x * alpha + beta,
   0), 1) * x; clip min(max(x, alpha), beta). */
enum { QG_ACT_NONE = 0, QG_ACT_RELU = 1, QG_ACT_HARDSWISH = 2, QG_ACT_CLIP = 3 };
static inline __attribute__((always_inline)) float qg_act_scalar(float x, int act, float alpha, float beta) {
    if (act == QG_ACT_RELU) return (x != x || x >= 0.0f) ? x : 0.0f;
    if (act == QG_ACT_CLIP) {
        if (x != x) return x;
        const float t = x < alpha ? alpha : x;
        return t > beta ? beta : t;
    }
    if (act == QG_ACT_HARDSWISH) {
        float t = x * alpha;
        t = t + beta;
        if (t == t) t = t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
        return t * x;
    }
    return x;
}

/* ONNX QuantizeLinear of n float32 values (through the activation act first) with one scale and zero point,
   as ops' reference computes it: v = x / s in float32, rint (half to even) + zp, saturated to the output
   type; NaN -> 0 (numpy's nan_to_num before the cast). y is uint8 (is_signed 0) or int8 bytes. */
static inline __attribute__((always_inline)) void qg_ql_body(const float *x, const float *res, int64_t n,
                                                             float s, float z, float lo, float hi, int act,
                                                             float alpha, float beta, uint8_t *y) {
    for (int64_t i = 0; i < n; ++i) {
        const float v = qg_act_scalar(res ? x[i] + res[i] : x[i], act, alpha, beta) / s;
        float q = (v == v) ? (fabsf(v) < 4194304.0f ? ((v + QG_MAGIC) - QG_MAGIC) : v) + z : 0.0f;
        q = q < lo ? lo : (q > hi ? hi : q);
        y[i] = (uint8_t)(int32_t)q;
    }
}
static void qg_ql_base(const float *x, const float *res, int64_t n, float s, float z, float lo, float hi, int act,
                       float alpha, float beta, uint8_t *y) {
    qg_ql_body(x, res, n, s, z, lo, hi, act, alpha, beta, y);
}
#if QG_X86
/* 16 lanes through the activation; max / min take the value second so that a NaN passes (as numpy's) */
static inline __attribute__((always_inline)) T512 __m512 qg_act_512(__m512 v, int act, __m512 alpha,
                                                                  __m512 beta) {
    const __m512 zero = _mm512_setzero_ps();
    if (act == QG_ACT_RELU) return _mm512_max_ps(zero, v);
    if (act == QG_ACT_CLIP) return _mm512_min_ps(beta, _mm512_max_ps(alpha, v));
    if (act == QG_ACT_HARDSWISH) {
        __m512 t = _mm512_add_ps(_mm512_mul_ps(v, alpha), beta);
        t = _mm512_min_ps(_mm512_set1_ps(1.0f), _mm512_max_ps(zero, t));
        return _mm512_mul_ps(t, v);
    }
    return v;
}

/* y = clip(rint(act(x) / s) + z, lo, hi), NaN -> 0, for n values: the bytes of the division
   (qg_rint_quotient_512) */
static T512 void qg_ql_512(const float *x, const float *res, int64_t n, float s, float z, float lo, float hi,
                           int act, float alpha, float beta, uint8_t *y) {
    const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(z), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    const __m512 rcp = _mm512_set1_ps(1.0f / s), va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const int divide_all = qg_divide_all(s);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
        if (res) xv = _mm512_add_ps(xv, _mm512_maskz_loadu_ps(m, res + i));
        xv = qg_act_512(xv, act, va, vb);
        const __m512 r = qg_rint_quotient_512(xv, vs, rcp, divide_all);
        const __mmask16 ok = _mm512_cmp_ps_mask(r, r, _CMP_ORD_Q);
        __m512 v = _mm512_add_ps(r, vz);
        v = _mm512_maskz_mov_ps(ok, _mm512_min_ps(_mm512_max_ps(v, vlo), vhi)); /* NaN -> 0 */
        _mm512_mask_cvtepi32_storeu_epi8(y + i, m, _mm512_cvttps_epi32(v));
    }
}
#endif

static void qg_ql_one(const float *x, const float *res, int64_t n, float s, int32_t zp, int is_signed, int act,
                      float alpha, float beta, uint8_t *y) {
    const float lo = is_signed ? -128.0f : 0.0f, hi = is_signed ? 127.0f : 255.0f;
#if QG_X86
    if (qg_avx512vnni()) {
        qg_ql_512(x, res, n, s, (float)zp, lo, hi, act, alpha, beta, y);
        return;
    }
#endif
    qg_ql_base(x, res, n, s, (float)zp, lo, hi, act, alpha, beta, y);
}

/* one thread's share of a QuantizeLinear: values [i0, i1) */
typedef struct {
    const float *x, *res;
    uint8_t *y;
    int64_t i0, i1;
    float s, alpha, beta;
    int32_t zp;
    int is_signed, act;
} qg_ql_job;
static void qg_ql_job_run(const void *p) {
    const qg_ql_job *j = (const qg_ql_job *)p;
    qg_ql_one(j->x + j->i0, j->res ? j->res + j->i0 : NULL, j->i1 - j->i0, j->s, j->zp, j->is_signed, j->act,
              j->alpha, j->beta, j->y + j->i0);
}

/* the fewest values worth a thread: a QuantizeLinear of a tensor another kernel wrote (the pool's wake-up
   is a few us), and a convolution's requantization, whose input is hot in the calling core's cache
   (another core reading half of a small one cost more than the split saved: MobileNet-V3's fused calls at
   two threads 0.70 -> 0.84 ms with 16K) */
#define QG_QL_MIN_PER_THREAD (16 * 1024)
#define QG_RQ_MIN_PER_THREAD (128 * 1024)

/* QuantizeLinear(act(x [+ res])) of n values on up to nthreads threads of >= min_per_thread values (ops'
   pool when set), in 64-value aligned shares: every value is computed alone, so the bytes do not depend
   on the split. act: QG_ACT_*; res: NULL or n float32 added first (a residual connection; x + res is
   res + x in IEEE arithmetic). */
static int qg_requantize(const float *x, const float *res, int64_t n, int act, float alpha, float beta, float s,
                         int32_t zp, int is_signed, uint8_t *y, int nthreads, int64_t min_per_thread) {
    if (n < 0 || !(s == s) || act < QG_ACT_NONE || act > QG_ACT_CLIP) return QG_ERR_ARGS;
    int64_t nt = nthreads < 1 ? 1 : nthreads;
    if (nt > 64) nt = 64;
    if (nt > n / min_per_thread) nt = n / min_per_thread;
    if (nt <= 1) {
        qg_ql_one(x, res, n, s, zp, is_signed, act, alpha, beta, y);
        return QG_OK;
    }
    qg_ql_job jobs[64];
    const int64_t share = ((n + nt - 1) / nt + 63) & ~(int64_t)63;
    int used = 0;
    for (int64_t i0 = 0; i0 < n; i0 += share, ++used)
        jobs[used] = (qg_ql_job){x, res, y, i0, i0 + share < n ? i0 + share : n, s, alpha, beta, zp, is_signed, act};
    qg_parallel(qg_ql_job_run, jobs, sizeof(qg_ql_job), used);
    return QG_OK;
}

/* a convolution's float result (x) requantized: qg_requantize with the convolution's thread minimum */
int opstrata_requantize_f32(const float *x, const float *res, int64_t n, int act, float alpha, float beta,
                            float s, int32_t zp, int is_signed, uint8_t *y, int nthreads) {
    return qg_requantize(x, res, n, act, alpha, beta, s, zp, is_signed, y, nthreads, QG_RQ_MIN_PER_THREAD);
}

int opstrata_quantize_linear_mt(const float *x, int64_t n, float s, int32_t zp, int is_signed, uint8_t *y,
                                int nthreads) {
    return qg_requantize(x, NULL, n, QG_ACT_NONE, 0.0f, 0.0f, s, zp, is_signed, y, nthreads, QG_QL_MIN_PER_THREAD);
}

int opstrata_quantize_linear(const float *x, int64_t n, float s, int32_t zp, int is_signed, uint8_t *y) {
    return opstrata_quantize_linear_mt(x, n, s, zp, is_signed, y, 1);
}

/* ------------------------------------------------------------------ weight-only GEMM (int4 / int8 weights) */

/* y (M x N) = x (M x K float32) @ dequant(W): W packed in panels of 16 columns as unsigned codes
   u = q + offset: bits 8: 16 bytes per k; bits 4: 16 bytes per pair of k (k even in the low nibble,
   k + 1 in the high one; K padded to even with zero codes);
   per group of `group` rows of K and per column a float32 scale s and shift t (t = -zp * s in the code
   domain), so w = u * s + t. Each thread dequantizes its panels KC rows at a time into a float tile
   (16 columns) and runs every row of x against it, accumulating in out. */
#define DQ_KC 256
#define DQ_MR 8
typedef struct {
    int64_t M, N, K, ldx, ldo, group, p0, p1;
    const float *x;
    const uint8_t *wp;
    int bits;
    const float *sc, *sh, *bias; /* (G, N), (G, N), N or NULL */
    float *out;
} qg_dq_job;

/* code of column c at row k of a panel */
static inline __attribute__((always_inline)) float qg_code(const uint8_t *panel, int bits, int64_t k, int c) {
    return bits == 4 ? (float)((panel[(k >> 1) * 16 + c] >> ((k & 1) * 4)) & 15) : (float)panel[k * 16 + c];
}

static void qg_dqmm_portable(const qg_dq_job *j) {
    const int64_t pb = j->bits == 4 ? (j->K + 1) / 2 * 16 : j->K * 16; /* bytes per panel */
    float tile[DQ_KC * 16];
    for (int64_t p = j->p0; p < j->p1; ++p) {
        const int64_t c0 = p * 16, nc = j->N - c0 < 16 ? j->N - c0 : 16;
        for (int64_t k0 = 0; k0 < j->K; k0 += DQ_KC) {
            const int64_t kc = j->K - k0 < DQ_KC ? j->K - k0 : DQ_KC;
            for (int64_t k = 0; k < kc; ++k) {
                const uint8_t *panel = j->wp + p * pb;
                const int64_t g = (k0 + k) / j->group;
                for (int c = 0; c < 16; ++c) {
                    const int64_t n = c0 + (c < nc ? c : 0);
                    tile[k * 16 + c] = qg_code(panel, j->bits, k0 + k, c) * j->sc[g * j->N + n] + j->sh[g * j->N + n];
                }
            }
            for (int64_t m = 0; m < j->M; ++m) {
                float acc[16];
                float *o = j->out + m * j->ldo + c0;
                for (int c = 0; c < 16; ++c) acc[c] = 0.0f;
                const float *xr = j->x + m * j->ldx + k0;
                for (int64_t k = 0; k < kc; ++k)
                    for (int c = 0; c < 16; ++c) acc[c] += xr[k] * tile[k * 16 + c];
                for (int64_t c = 0; c < nc; ++c) o[c] = (k0 ? o[c] : (j->bias ? j->bias[c0 + c] : 0.0f)) + acc[c];
            }
        }
    }
}

#if QG_X86
/* 16 codes of row k of a panel as int32 lanes */
static inline __attribute__((always_inline)) T512 __m512i qg_codes(const uint8_t *panel, int bits, int64_t k) {
    if (bits == 4) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(panel + (k >> 1) * 16)));
        return _mm512_and_si512(_mm512_srli_epi32(b, (unsigned)((k & 1) * 4)), _mm512_set1_epi32(15));
    }
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(panel + k * 16)));
}

static T512 void qg_dqmm_512(const qg_dq_job *j) {
    const int64_t pb = j->bits == 4 ? (j->K + 1) / 2 * 16 : j->K * 16;
    float tile[DQ_KC * 16] __attribute__((aligned(64)));
    for (int64_t p = j->p0; p < j->p1; ++p) {
        const int64_t c0 = p * 16, nc = j->N - c0 < 16 ? j->N - c0 : 16;
        const __mmask16 m16 = nc >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nc) - 1u);
        for (int64_t k0 = 0; k0 < j->K; k0 += DQ_KC) {
            const int64_t kc = j->K - k0 < DQ_KC ? j->K - k0 : DQ_KC;
            int64_t g_prev = -1;
            __m512 s = _mm512_setzero_ps(), t = s;
            for (int64_t k = 0; k < kc; ++k) { /* the tile: 16 columns of kc rows, dequantized */
                const int64_t g = (k0 + k) / j->group;
                if (g != g_prev) {
                    s = _mm512_maskz_loadu_ps(m16, j->sc + g * j->N + c0);
                    t = _mm512_maskz_loadu_ps(m16, j->sh + g * j->N + c0);
                    g_prev = g;
                }
                const __m512i u = qg_codes(j->wp + p * pb, j->bits, k0 + k);
                _mm512_store_ps(tile + k * 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), s, t));
            }
            for (int64_t m = 0; m < j->M; m += DQ_MR) { /* up to 8 rows of x against the tile */
                const int mr = j->M - m < DQ_MR ? (int)(j->M - m) : DQ_MR;
                __m512 acc[DQ_MR];
                for (int r = 0; r < DQ_MR; ++r) acc[r] = _mm512_setzero_ps();
                const float *xr = j->x + m * j->ldx + k0;
                if (mr == DQ_MR) {
                    for (int64_t k = 0; k < kc; ++k) {
                        const __m512 w = _mm512_load_ps(tile + k * 16);
                        for (int r = 0; r < DQ_MR; ++r)
                            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r * j->ldx + k]), w, acc[r]);
                    }
                } else {
                    for (int64_t k = 0; k < kc; ++k) {
                        const __m512 w = _mm512_load_ps(tile + k * 16);
                        for (int r = 0; r < mr; ++r)
                            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r * j->ldx + k]), w, acc[r]);
                    }
                }
                for (int r = 0; r < mr; ++r) {
                    float *o = j->out + (m + r) * j->ldo + c0;
                    const __m512 prev = k0 ? _mm512_maskz_loadu_ps(m16, o)
                                           : (j->bias ? _mm512_maskz_loadu_ps(m16, j->bias + c0) : _mm512_setzero_ps());
                    _mm512_mask_storeu_ps(o, m16, _mm512_add_ps(prev, acc[r]));
                }
            }
        }
    }
}
#endif

#if QG_X86
/* few rows (decode): no tile; per scale group the codes' dot products a_r = sum_k x[r, k] u_k are formed
   straight from the expanded codes, then out_r += s * a_r + t * sum_k x[r, k] (w = u s + t) */
#define DQ_MS 4
static T512 void qg_dqmm_few_512(const qg_dq_job *j) {
    const int64_t pb = j->bits == 4 ? (j->K + 1) / 2 * 16 : j->K * 16;
    const int mr = (int)j->M;
    const int64_t G = (j->K + j->group - 1) / j->group;
    float *xs = (float *)malloc(sizeof(float) * (size_t)(mr * G)); /* sum of x over each group, per row */
    if (!xs) return;                                               /* the caller probed this allocation */
    for (int r = 0; r < mr; ++r)
        for (int64_t g = 0; g < G; ++g) {
            const int64_t k1 = (g + 1) * j->group < j->K ? (g + 1) * j->group : j->K;
            float acc = 0.0f;
            for (int64_t k = g * j->group; k < k1; ++k) acc += j->x[r * j->ldx + k];
            xs[r * G + g] = acc;
        }
    const __m512i nib = _mm512_set1_epi32(15);
    for (int64_t p = j->p0; p < j->p1; ++p) {
        const int64_t c0 = p * 16, nc = j->N - c0 < 16 ? j->N - c0 : 16;
        const __mmask16 m16 = nc >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nc) - 1u);
        const uint8_t *panel = j->wp + p * pb;
        __m512 out[DQ_MS];
        for (int r = 0; r < mr; ++r)
            out[r] = j->bias ? _mm512_maskz_loadu_ps(m16, j->bias + c0) : _mm512_setzero_ps();
        for (int64_t g = 0; g < G; ++g) {
            const int64_t k0 = g * j->group, k1 = k0 + j->group < j->K ? k0 + j->group : j->K;
            __m512 a[DQ_MS];
            for (int r = 0; r < mr; ++r) a[r] = _mm512_setzero_ps();
            int64_t k = k0;
            if (j->bits == 4) {
                if (k & 1) { /* a group starting on an odd row: its first code alone */
                    const __m512 uf = _mm512_cvtepi32_ps(qg_codes(panel, 4, k));
                    for (int r = 0; r < mr; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(j->x[r * j->ldx + k]), uf, a[r]);
                    ++k;
                }
                for (; k + 1 < k1; k += 2) { /* one 16-byte load: rows k (low nibbles) and k + 1 (high) */
                    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(panel + (k >> 1) * 16)));
                    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, nib));
                    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
                    for (int r = 0; r < mr; ++r) {
                        const float *xr = j->x + r * j->ldx + k;
                        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[0]), lo, a[r]);
                        a[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[1]), hi, a[r]);
                    }
                }
            }
            for (; k < k1; ++k) {
                const __m512 uf = _mm512_cvtepi32_ps(qg_codes(panel, j->bits, k));
                for (int r = 0; r < mr; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(j->x[r * j->ldx + k]), uf, a[r]);
            }
            const __m512 s = _mm512_maskz_loadu_ps(m16, j->sc + g * j->N + c0);
            const __m512 t = _mm512_maskz_loadu_ps(m16, j->sh + g * j->N + c0);
            for (int r = 0; r < mr; ++r)
                out[r] = _mm512_add_ps(out[r], _mm512_fmadd_ps(s, a[r], _mm512_mul_ps(t, _mm512_set1_ps(xs[r * G + g]))));
        }
        for (int r = 0; r < mr; ++r) _mm512_mask_storeu_ps(j->out + r * j->ldo + c0, m16, out[r]);
    }
    free(xs);
}
#endif

static void qg_dqmm_run(const qg_dq_job *j) {
#if QG_X86
    if (qg_avx512vnni() && j->M <= DQ_MS) {
        qg_dqmm_few_512(j);
        return;
    }
    if (qg_avx512vnni()) {
        qg_dqmm_512(j);
        return;
    }
#endif
    qg_dqmm_portable(j);
}

static void qg_dqmm_job_run(const void *j) { qg_dqmm_run((const qg_dq_job *)j); }

int opstrata_dqgemm(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *wp, int bits,
                    const float *sc, const float *sh, int64_t group, const float *bias, float *out, int64_t ldo,
                    int nthreads) {
    if (M < 0 || N < 0 || K < 0 || (bits != 4 && bits != 8) || group < 1) return QG_ERR_ARGS;
    if (M == 0 || N == 0) return QG_OK;
    if (K == 0) {
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) out[m * ldo + n] = bias ? bias[n] : 0.0f;
        return QG_OK;
    }
    const int64_t panels = (N + 15) / 16;
    void *probe = malloc(sizeof(float) * (size_t)(M * ((K + group - 1) / group) + 1));
    if (!probe) return QG_ERR_NOMEM;
    free(probe);
    qg_dq_job base = {M, N, K, ldx, ldo, group, 0, panels, x, wp, bits, sc, sh, bias, out};
    int64_t by_work = (M * N * K) >> 22;
    if (nthreads > by_work) nthreads = by_work > 1 ? (int)by_work : 1;
    if (nthreads > panels) nthreads = (int)panels;
    if (nthreads > 64) nthreads = 64;
    if (nthreads <= 1) {
        qg_dqmm_run(&base);
        return QG_OK;
    }
    qg_dq_job jobs[64];
    for (int t = 0; t < nthreads; ++t) {
        jobs[t] = base;
        jobs[t].p0 = panels * t / nthreads;
        jobs[t].p1 = panels * (t + 1) / nthreads;
    }
    qg_parallel(qg_dqmm_job_run, jobs, sizeof(qg_dq_job), nthreads);
    return QG_OK;
}

/* ------------------------------------------------------------------ packed entry points (ops' native batches)

   int fn(const int64_t *a): the arguments of the function above as one int64 block (pointers as addresses),
   so that ops' opstrata_call_packed can run them from a batch of bound calls (its "foreign" id) beside its own
   kernels. The activation zero point is read through a pointer when the call runs (a[7] / a[3]: its address,
   0 for none), as the Python binding read it on every run. */
#define QG_PTR(i, T) ((T)(intptr_t)a[i])

static int32_t qg_zero_point_at(int64_t addr, int is_signed) {
    if (!addr) return 0;
    return is_signed ? (int32_t)*(const int8_t *)(intptr_t)addr : (int32_t)*(const uint8_t *)(intptr_t)addr;
}

int opstrata_qconv2d_packed(const int64_t *a) {
    return opstrata_qconv2d((int)a[0], a[1], a[2], a[3], a[4], QG_PTR(5, const uint8_t *), (int)a[6],
                            qg_zero_point_at(a[7], (int)a[6]), a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
                            a[16], a[17], a[18], a[19], QG_PTR(20, const int8_t *const *),
                            QG_PTR(21, const int32_t *const *), QG_PTR(22, const int32_t *const *),
                            QG_PTR(23, const float *), a[24], QG_PTR(25, const float *), QG_PTR(26, float *), (int)a[27]);
}

int opstrata_qconv2d_depthwise_packed(const int64_t *a) {
    return opstrata_qconv2d_depthwise((int)a[0], a[1], a[2], a[3], a[4], QG_PTR(5, const uint8_t *), (int)a[6],
                                      qg_zero_point_at(a[7], (int)a[6]), a[8], a[9], a[10], a[11], a[12], a[13],
                                      a[14], a[15], a[16], a[17], QG_PTR(18, const int16_t *), QG_PTR(19, const float *),
                                      QG_PTR(20, const float *), QG_PTR(21, const float *), a[22],
                                      QG_PTR(23, const float *), QG_PTR(24, float *), (int)a[25]);
}

int opstrata_qgemm_packed(const int64_t *a) {
    return opstrata_qgemm((int)a[0], a[1], a[2], a[3], QG_PTR(4, const uint8_t *), a[5], (int)a[6],
                          QG_PTR(7, const int32_t *), a[8], QG_PTR(9, const int8_t *), QG_PTR(10, const int32_t *),
                          QG_PTR(11, const int32_t *), (int)a[12], QG_PTR(13, void *), a[14], QG_PTR(15, const float *),
                          a[16], QG_PTR(17, const float *), a[18], QG_PTR(19, const float *), (int)a[20], (int32_t)a[21],
                          (int)a[22]);
}

/* x (n float32) -> y with the scale read at a[2] (a float32) when the call runs, on up to a[6] threads. A
   NaN scale makes every value NaN, which the reference (ops' kernel: division, rint, + zero point, NaN -> 0,
   saturation) turns into 0: the same here, where the eager entry point refuses it. */
int opstrata_quantize_linear_packed(const int64_t *a) {
    const float s = *QG_PTR(2, const float *);
    const int is_signed = (int)a[4];
    if (!(s == s)) {
        if (a[1] > 0) memset(QG_PTR(5, uint8_t *), 0, (size_t)a[1]);
        return QG_OK;
    }
    return opstrata_quantize_linear_mt(QG_PTR(0, const float *), a[1], s, qg_zero_point_at(a[3], is_signed), is_signed,
                                       QG_PTR(5, uint8_t *), (int)a[6]);
}

/* A convolution's float result, kept per calling thread between the convolution and its quantization
   (opstrata_qconv_quantize_packed): grown as needed, freed when the thread ends. */
static pthread_key_t qg_scratch_key;
static pthread_once_t qg_scratch_once = PTHREAD_ONCE_INIT;
typedef struct {
    float *p;
    int64_t n;
} qg_scratch;
static void qg_scratch_free(void *v) {
    qg_scratch *sc = (qg_scratch *)v;
    if (sc) free(sc->p);
    free(sc);
}
static void qg_scratch_init(void) { (void)pthread_key_create(&qg_scratch_key, qg_scratch_free); }
static float *qg_scratch_get(int64_t n) {
    (void)pthread_once(&qg_scratch_once, qg_scratch_init);
    qg_scratch *sc = (qg_scratch *)pthread_getspecific(qg_scratch_key);
    if (!sc) {
        sc = (qg_scratch *)calloc(1, sizeof *sc);
        if (!sc || pthread_setspecific(qg_scratch_key, sc)) {
            free(sc);
            return NULL;
        }
    }
    if (sc->n < n) {
        float *p = NULL;
        if (posix_memalign((void **)&p, 64, (size_t)(n > 0 ? n : 1) * sizeof(float))) return NULL;
        free(sc->p);
        sc->p = p;
        sc->n = n;
    }
    return sc->p;
}

/* QConvQuantize: a packed convolution (a[0]: 0 opstrata_qconv2d_packed, 1 the depthwise one; a[1]: the
   address of its argument block, a[2] entries, a[3] the index of its float output there) into this
   thread's scratch, then QuantizeLinear(act(.)) of its a[4] values into a[10] on up to a[11] threads: a[5] the
   activation (QG_ACT_*), a[6] its alpha and beta (two float32), a[7] the output scale (a float32) and a[8]
   the zero point (one byte, 0: none), a[9] signed codes, a[12] a float32 residual added before the
   activation (0: none). Scale and zero point read when the call runs; a NaN scale makes every code 0, as
   QuantizeLinear does. */
int opstrata_qconv_quantize_packed(const int64_t *a) {
    int64_t blk[40];
    const int64_t entries = a[2], slot = a[3], n = a[4];
    if (entries < 1 || entries > 40 || slot < 0 || slot >= entries || n < 0) return QG_ERR_ARGS;
    float *scratch = qg_scratch_get(n);
    if (!scratch) return QG_ERR_NOMEM;
    memcpy(blk, QG_PTR(1, const int64_t *), (size_t)entries * sizeof(int64_t));
    blk[slot] = (int64_t)(intptr_t)scratch;
    const int rc = a[0] ? opstrata_qconv2d_depthwise_packed(blk) : opstrata_qconv2d_packed(blk);
    if (rc != QG_OK) return rc;
    const float s = *QG_PTR(7, const float *);
    const int is_signed = (int)a[9];
    if (!(s == s)) {
        if (n > 0) memset(QG_PTR(10, uint8_t *), 0, (size_t)n);
        return QG_OK;
    }
    const float *ab = QG_PTR(6, const float *);
    return opstrata_requantize_f32(scratch, QG_PTR(12, const float *), n, (int)a[5], ab[0], ab[1], s,
                                   qg_zero_point_at(a[8], is_signed), is_signed, QG_PTR(10, uint8_t *), (int)a[11]);
}
#undef QG_PTR
