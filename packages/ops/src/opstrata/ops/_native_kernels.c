/* opstrata native float32 kernels: exact GELU (with a bias, the GEMM epilogue) and layer norm over rows.

   Compiled on first use by opstrata.ops._native with the system C compiler and loaded through ctypes;
   one fused loop each where numpy needs ~17 (GELU) or ~6 (layer norm) passes. Plain C99, vectorized
   by the compiler (no intrinsics): the lane accumulators below keep reductions vectorizable without
   -ffast-math, so NaN and inf keep their IEEE meaning. */
#include <math.h>
#include <stdint.h>

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

/* out[r, j] = gelu(x[r, j] + bias[j]) (bias may be NULL); out may be x. */
void opstrata_bias_gelu_f32(const float *x, const float *bias, float *out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *orow = out + r * cols;
        if (bias) {
            for (int64_t j = 0; j < cols; ++j) orow[j] = gelu_f32(xr[j] + bias[j]);
        } else {
            for (int64_t j = 0; j < cols; ++j) orow[j] = gelu_f32(xr[j]);
        }
    }
}

#define LANES 16

int opstrata_native_abi(void) { return 1; }

/* sum of a row in LANES independent float partial sums (vectorizable), combined in double */
static double row_sum(const float *x, int64_t n) {
    float acc[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; ++k) acc[k] += x[j + k];
    double s = 0.0;
    for (int k = 0; k < LANES; ++k) s += acc[k];
    for (; j < n; ++j) s += x[j];
    return s;
}

/* sums of d and d^2 for d = x - shift: x and a shift near the mean are close, so d is exact (Sterbenz)
   and the float32 rounding of the mean itself is corrected by sum(d) / n */
static void row_dev(const float *x, int64_t n, float shift, double *s1, double *s2) {
    float a1[LANES] = {0}, a2[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; ++k) {
            float d = x[j + k] - shift;
            a1[k] += d;
            a2[k] += d * d;
        }
    double t1 = 0.0, t2 = 0.0;
    for (int k = 0; k < LANES; ++k) {
        t1 += a1[k];
        t2 += a2[k];
    }
    for (; j < n; ++j) {
        double d = (double)(x[j] - shift);
        t1 += d;
        t2 += d * d;
    }
    *s1 = t1;
    *s2 = t2;
}

/* out[r] = (x[r] - mean) / sqrt(var + eps) * w + b over rows of n (w, b may be NULL); out may be x.
   Shifted two-pass statistics in float32 lanes combined in double: accurate for rows with a large mean. */
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
