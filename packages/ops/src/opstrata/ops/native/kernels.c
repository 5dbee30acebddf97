/* opstrata native float32 kernels: GELU (exact and tanh form, with a bias: the GEMM epilogue), layer
   norm and softmax over rows.

   Compiled on first use by opstrata.ops._native with the system C compiler and loaded through ctypes;
   one fused loop each where numpy needs 6-17 passes. C99 plus the GCC/Clang vector extension (no
   intrinsics, so any target the compiler knows): elementwise loops are vectorized by the compiler;
   row reductions (sum, max) run on explicit vector accumulators, since without -ffast-math the
   compiler may not reorder a scalar reduction -- and -ffast-math would drop NaN / inf semantics. */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef float vf __attribute__((vector_size(32))); /* 8 floats: AVX, or two SSE / NEON registers */
typedef int32_t vi __attribute__((vector_size(32)));
#define VW 8

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline vf vsplat(float x) { return (vf){x, x, x, x, x, x, x, x}; }
static inline vf vmax(vf a, vf b) { /* a > b ? a : b lane-wise (a NaN in a loses, as the scalar form) */
    vi gt = a > b;
    return (vf)(((vi)a & gt) | ((vi)b & ~gt));
}
static inline double vsum(vf a) {
    double s = 0.0;
    for (int k = 0; k < VW; ++k) s += a[k];
    return s;
}
static inline float vmax_all(vf a) {
    float m = a[0];
    for (int k = 1; k < VW; ++k) m = a[k] > m ? a[k] : m;
    return m;
}

int opstrata_native_abi(void) { return 3; }

/* erf by Eigen/XLA's rational form x P(x^2) / Q(x^2) on [-4, 4]; the ternary clamps keep NaN. */
static inline float erf_f32(float x) {
    float c = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
    float z = c * c;
    float p = -2.72614225801306e-10f;
    p = p * z + 2.77068142495902e-08f;
    p = p * z + -2.10102402082508e-06f;
    p = p * z + -5.69250639462346e-05f;
    p = p * z + -7.34990630326855e-04f;
    p = p * z + -2.95459980854025e-03f;
    p = p * z + -1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * z + -2.13374055278905e-04f;
    q = q * z + -1.68282697438203e-03f;
    q = q * z + -7.37332916720468e-03f;
    q = q * z + -1.42647390514189e-02f;
    float r = c * p / q;
    return r < -1.0f ? -1.0f : (r > 1.0f ? 1.0f : r);
}

static inline float gelu_f32(float h) { return 0.5f * h * (1.0f + erf_f32(h * 0.70710678118654752f)); }

/* exp by Cody-Waite reduction x = n ln2 + r and Cephes' degree-6 polynomial for exp(r), 2^n built in the
   exponent bits (vectorizable: no libm call); ~1 ulp. Internal: its callers pass x <= 0 (softmax) or
   saturate long before overflow (tanh), so it returns 0 below -87.34 (no denormals) and inf above 88.37
   (n = 127 is the largest exponent built; the true overflow is at 88.72). NaN propagates. */
static inline float exp_f32(float x) {
    float xc = x > 88.3762626f ? 88.3762626f : (x < -87.3365448f ? -87.3365448f : x);
    float n = rintf(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x < -87.3365448f ? 0.0f : (x > 88.3762626f ? INFINITY : y);
}

/* tanh(y) = sign(y) (1 - 2 / (exp(2|y|) + 1)): no cancellation for large |y|, ~1e-7 absolute near 0 */
static inline float tanh_f32(float y) {
    float a = y < 0.0f ? -y : y;
    float t = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
    return y < 0.0f ? -t : t;
}

/* the tanh form of GELU: 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))) */
static inline float gelu_tanh_f32(float h) {
    float inner = 0.7978845608028654f * (h + 0.044715f * h * h * h);
    return 0.5f * h * (1.0f + tanh_f32(inner));
}

static inline float relu_f32(float h) { return h < 0.0f ? 0.0f : h; } /* NaN stays NaN, as np.maximum */

/* SiLU h sigmoid(h) = h / (1 + exp(-h)); far left exp overflows and h / inf gives -0, the limit */
static inline float silu_f32(float h) { return h / (1.0f + exp_f32(-h)); }

/* one loop per activation over rows of cols, the bias row (optional) added first */
#define BIAS_ACT_LOOP(ACT)                                                                    \
    for (int64_t r = 0; r < rows; ++r) {                                                      \
        const float *xr = x + r * cols;                                                       \
        float *orow = out + r * cols;                                                         \
        if (bias) {                                                                           \
            for (int64_t j = 0; j < cols; ++j) orow[j] = ACT(xr[j] + bias[j]);                \
        } else {                                                                              \
            for (int64_t j = 0; j < cols; ++j) orow[j] = ACT(xr[j]);                          \
        }                                                                                     \
    }

/* out[r, j] = act(x[r, j] + bias[j]) (bias may be NULL; out may be x), act: 0 exact GELU, 1 tanh GELU,
   2 ReLU, 3 SiLU. Returns 0, or -1 for an unknown act. */
int opstrata_bias_act_f32(const float *x, const float *bias, float *out, int64_t rows, int64_t cols, int act) {
    switch (act) {
    case 0: BIAS_ACT_LOOP(gelu_f32) return 0;
    case 1: BIAS_ACT_LOOP(gelu_tanh_f32) return 0;
    case 2: BIAS_ACT_LOOP(relu_f32) return 0;
    case 3: BIAS_ACT_LOOP(silu_f32) return 0;
    default: return -1;
    }
}

/* Row softmax: out[r] = exp(x[r] - max) / sum; lse[r] = max + log(sum) when lse is not NULL. A row whose
   every entry is -inf gives zeros and lse -inf (as the numpy kernels); out may be x. */
void opstrata_softmax_rows_f32(const float *x, float *out, float *lse, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * n;
        float *orow = out + r * n;
        vf m0 = vsplat(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        int64_t j = 0;
        for (; j + 4 * VW <= n; j += 4 * VW) {
            m0 = vmax(vload(xr + j), m0);
            m1 = vmax(vload(xr + j + VW), m1);
            m2 = vmax(vload(xr + j + 2 * VW), m2);
            m3 = vmax(vload(xr + j + 3 * VW), m3);
        }
        for (; j + VW <= n; j += VW) m0 = vmax(vload(xr + j), m0);
        float mx = vmax_all(vmax(vmax(m0, m1), vmax(m2, m3)));
        for (; j < n; ++j) mx = xr[j] > mx ? xr[j] : mx;
        /* NaN needs no test here: it loses every comparison, then exp(NaN - max) makes the sum and the
           whole row NaN. Only a row of -inf and NaN would look empty: */
        if (mx == -INFINITY) {
            int has_nan = 0;
            for (j = 0; j < n; ++j) has_nan |= xr[j] != xr[j];
            for (j = 0; j < n; ++j) orow[j] = has_nan ? NAN : 0.0f;
            if (lse) lse[r] = has_nan ? NAN : -INFINITY;
            continue;
        }
        for (j = 0; j < n; ++j) orow[j] = exp_f32(xr[j] - mx);
        vf s0 = vsplat(0.0f), s1 = s0, s2 = s0, s3 = s0;
        for (j = 0; j + 4 * VW <= n; j += 4 * VW) {
            s0 += vload(orow + j);
            s1 += vload(orow + j + VW);
            s2 += vload(orow + j + 2 * VW);
            s3 += vload(orow + j + 3 * VW);
        }
        for (; j + VW <= n; j += VW) s0 += vload(orow + j);
        double sum = vsum((s0 + s1) + (s2 + s3));
        for (; j < n; ++j) sum += orow[j];
        float inv = (float)(1.0 / sum);
        for (j = 0; j < n; ++j) orow[j] *= inv;
        if (lse) lse[r] = (float)((double)mx + log(sum));
    }
}



/* sum of a row on four vector accumulators (independent chains: the adds overlap), combined in double */
static double row_sum(const float *x, int64_t n) {
    vf a0 = vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 4 * VW <= n; j += 4 * VW) {
        a0 += vload(x + j);
        a1 += vload(x + j + VW);
        a2 += vload(x + j + 2 * VW);
        a3 += vload(x + j + 3 * VW);
    }
    for (; j + VW <= n; j += VW) a0 += vload(x + j);
    double s = vsum((a0 + a1) + (a2 + a3));
    for (; j < n; ++j) s += x[j];
    return s;
}

/* sums of d and d^2 for d = x - shift: x and a shift near the mean are close, so d is exact (Sterbenz)
   and the float32 rounding of the mean itself is corrected by sum(d) / n. Two chains per sum. */
static void row_dev(const float *x, int64_t n, float shift, double *s1, double *s2) {
    vf sh = vsplat(shift), a1 = vsplat(0.0f), b1 = a1, a2 = a1, b2 = a1;
    int64_t j = 0;
    for (; j + 2 * VW <= n; j += 2 * VW) {
        vf d = vload(x + j) - sh, e = vload(x + j + VW) - sh;
        a1 += d;
        b1 += e;
        a2 += d * d;
        b2 += e * e;
    }
    for (; j + VW <= n; j += VW) {
        vf d = vload(x + j) - sh;
        a1 += d;
        a2 += d * d;
    }
    double t1 = vsum(a1 + b1), t2 = vsum(a2 + b2);
    for (; j < n; ++j) {
        double d = (double)(x[j] - shift);
        t1 += d;
        t2 += d * d;
    }
    *s1 = t1;
    *s2 = t2;
}

/* out[r] = (x[r] - mean) / sqrt(var + eps) * w + b over rows of n (w, b may be NULL); out may be x.
   Shifted two-pass statistics in float32 vector lanes combined in double: accurate for rows with a large mean. */
void opstrata_layer_norm_f32(const float *x, const float *w, const float *b, float *out, int64_t rows,
                             int64_t n, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * n;
        float *orow = out + r * n;
        float shift = (float)(row_sum(xr, n) / (double)n); /* the mean rounded to float32 */
        double s1, s2;
        row_dev(xr, n, shift, &s1, &s2);
        double delta = s1 / (double)n; /* mean - shift */
        double var = s2 / (double)n - delta * delta;
        float rstd = (float)(1.0 / sqrt((var > 0.0 ? var : 0.0) + (double)eps));
        float mean_lo = (float)delta;
        if (w && b) {
            for (int64_t j = 0; j < n; ++j) orow[j] = ((xr[j] - shift) - mean_lo) * rstd * w[j] + b[j];
        } else if (w) {
            for (int64_t j = 0; j < n; ++j) orow[j] = ((xr[j] - shift) - mean_lo) * rstd * w[j];
        } else if (b) {
            for (int64_t j = 0; j < n; ++j) orow[j] = ((xr[j] - shift) - mean_lo) * rstd + b[j];
        } else {
            for (int64_t j = 0; j < n; ++j) orow[j] = ((xr[j] - shift) - mean_lo) * rstd;
        }
    }
}
