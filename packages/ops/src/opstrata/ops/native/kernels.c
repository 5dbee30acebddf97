/* opstrata native float32 kernels: GELU (exact and tanh form, with a bias: the GEMM epilogue), layer
   norm and softmax over rows.

   Compiled on first use by opstrata.ops._native with the system C compiler and loaded through ctypes;
   one fused loop each where numpy needs 6-17 passes. C99 plus the GCC/Clang vector extension (no
   intrinsics, so any target the compiler knows): elementwise loops are vectorized by the compiler;
   row reductions (sum, max) run on explicit vector accumulators, since without -ffast-math the
   compiler may not reorder a scalar reduction -- and -ffast-math would drop NaN / inf semantics. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

int opstrata_native_abi(void) { return 22; }

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
   (n = 127 is the largest exponent built; the true overflow is at 88.72). NaN propagates. An input below
   the range is evaluated at 0 before its result is replaced by 0: clamped to -87.34 its product would be
   denormal, and a denormal multiply costs a ~150-cycle microcode assist per vector (every masked score of
   a softmax, where the mask is -inf or -3.4e38). */
/* exp(r) for the reduced argument r = x - n ln2 (Cody-Waite, n = rint(x / ln2)): Cephes' polynomial */
static inline float exp_reduced(float xc, float n) {
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

static inline float exp_f32(float x) {
    float xc = x > 88.3762626f ? 88.3762626f : (x < -87.3365448f ? 0.0f : x);
    float n = rintf(xc * 1.44269504088896341f);
    float p = exp_reduced(xc, n);
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

/* the tanh form of GELU, 0.5 h (1 + tanh(u)) with u = sqrt(2/pi) (h + 0.044715 h^3), computed as
   h sigmoid(2u) = h / (1 + exp(-2u)): the same function, one exp and one division, and no cancellation
   in 1 + tanh(u) for negative h (far left exp overflows and h / inf gives -0, the limit) */
static inline float gelu_tanh_f32(float h) {
    float u2 = 1.5957691216057308f * (h + 0.044715f * h * h * h);
    return h / (1.0f + exp_f32(-u2));
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

/* max of a row on four vector accumulators (-inf for n == 0; a NaN loses every comparison) */
static float row_max(const float *x, int64_t n) {
    vf m0 = vsplat(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j + 4 * VW <= n; j += 4 * VW) {
        m0 = vmax(vload(x + j), m0);
        m1 = vmax(vload(x + j + VW), m1);
        m2 = vmax(vload(x + j + 2 * VW), m2);
        m3 = vmax(vload(x + j + 3 * VW), m3);
    }
    for (; j + VW <= n; j += VW) m0 = vmax(vload(x + j), m0);
    float mx = vmax_all(vmax(vmax(m0, m1), vmax(m2, m3)));
    for (; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* Row softmax: out[r] = exp(x[r] - max) / sum; lse[r] = max + log(sum) when lse is not NULL. A row whose
   every entry is -inf gives zeros and lse -inf (as the numpy kernels); out may be x. */
void opstrata_softmax_rows_f32(const float *x, float *out, float *lse, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * n;
        float *orow = out + r * n;
        const float mx = row_max(xr, n);
        int64_t j;
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

/* sum of squares of a row on four vector accumulators, combined in double */
static double row_sumsq(const float *x, int64_t n) {
    vf a0 = vsplat(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 4 * VW <= n; j += 4 * VW) {
        vf x0 = vload(x + j), x1 = vload(x + j + VW), x2 = vload(x + j + 2 * VW), x3 = vload(x + j + 3 * VW);
        a0 += x0 * x0;
        a1 += x1 * x1;
        a2 += x2 * x2;
        a3 += x3 * x3;
    }
    for (; j + VW <= n; j += VW) {
        vf x0 = vload(x + j);
        a0 += x0 * x0;
    }
    double s = vsum((a0 + a1) + (a2 + a3));
    for (; j < n; ++j) s += (double)x[j] * x[j];
    return s;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w over rows of n (w may be NULL); out may be x. The mean
   of squares in float32 lanes combined in double (T5 / Llama RMSNorm). */
void opstrata_rms_norm_f32(const float *x, const float *w, float *out, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * n;
        float *orow = out + r * n;
        const float rstd = (float)(1.0 / sqrt(row_sumsq(xr, n) / (double)n + (double)eps));
        if (w) {
            for (int64_t j = 0; j < n; ++j) orow[j] = xr[j] * rstd * w[j];
        } else {
            for (int64_t j = 0; j < n; ++j) orow[j] = xr[j] * rstd;
        }
    }
}

/* ---------------------------------------------------------------------------------------------------
   A persistent worker pool for the kernels that split their work (the convolution GEMM). pool_run(fn,
   ctx, ntasks, nthreads) runs tasks 0 .. ntasks-1 on the calling thread and up to nthreads - 1 workers,
   each taking the next contiguous chunk of tasks from an atomic counter (see pool_work), and returns when
   all are done. One run at a time: a
   caller finding the pool busy (another Python thread's session) runs its tasks alone, so nothing
   oversubscribes and nothing waits on another run. Workers start on first use, poll for the next run
   briefly (POOL_SPIN_NS) and then sleep on a condition variable, and are never joined (they end with the process); a forked child starts with
   none. What a task computes does not depend on which thread runs it.
   ------------------------------------------------------------------------------------------------- */
#define POOL_MAX_THREADS 64
typedef void (*pool_fn)(void *ctx, int64_t task);
static pthread_mutex_t pool_busy = PTHREAD_MUTEX_INITIALIZER; /* held by the caller of the current run */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;   /* guards the fields below */
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER, pool_done = PTHREAD_COND_INITIALIZER;
static int pool_started, pool_want, pool_joined;
static _Atomic int pool_left;      /* workers still on the current run (changed under pool_mu) */
static _Atomic uint64_t pool_gen;  /* the run's number (changed under pool_mu) */
/* how long a worker keeps polling for the next run, and the caller for the workers' end, before sleeping
   on a condition variable: a sleeping thread on a virtual machine can take tens of microseconds to
   wake, longer than a kernel's share of work; a session's kernels follow each other within that */
#define POOL_SPIN_NS 100000
static pool_fn pool_job;
static void *pool_ctx;
static int64_t pool_ntasks;
static _Atomic int64_t pool_next;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void pool_after_fork_child(void) { /* the workers did not come along */
    pthread_mutex_init(&pool_busy, NULL);
    pthread_mutex_init(&pool_mu, NULL);
    pthread_cond_init(&pool_wake, NULL);
    pthread_cond_init(&pool_done, NULL);
    pool_started = pool_want = pool_joined = 0;
    atomic_store(&pool_left, 0);
}
static void pool_init(void) { pthread_atfork(NULL, NULL, pool_after_fork_child); }

/* the run's tasks in contiguous chunks, one per thread it asked for: the caller takes chunk 0, the workers
   the next ones as they join, and a thread done with its chunk takes any left. Consecutive kernels of one
   shape then hand the same rows / strips / planes to the same thread, so a layer reads the part of its
   input that the thread's own core wrote (not a line written by the other core: that costs ~15% at two
   threads), and a late worker still only delays its own chunk. */
static int64_t pool_chunk;
static void pool_run_chunk(int64_t c) {
    const int64_t t0 = c * pool_chunk, t1 = t0 + pool_chunk < pool_ntasks ? t0 + pool_chunk : pool_ntasks;
    for (int64_t t = t0; t < t1; ++t) pool_job(pool_ctx, t);
}
static void pool_work(void) {
    int64_t c;
    while ((c = atomic_fetch_add(&pool_next, 1)) * pool_chunk < pool_ntasks) pool_run_chunk(c);
}

static int64_t pool_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void pool_relax(void) { sched_yield(); } /* a thread sharing this core gets it first */

/* 1 once `cond` holds, polling for up to POOL_SPIN_NS; 0 when the time ran out first */
#define POOL_SPIN_UNTIL(cond)                                                                               \
    ({                                                                                                      \
        int ok_ = 0;                                                                                        \
        const int64_t t0_ = pool_now_ns();                                                                  \
        for (int64_t i_ = 0;; ++i_) {                                                                       \
            if (cond) {                                                                                     \
                ok_ = 1;                                                                                    \
                break;                                                                                      \
            }                                                                                               \
            pool_relax();                                                                                   \
            if ((i_ & 15) == 15 && pool_now_ns() - t0_ > POOL_SPIN_NS) break;                              \
        }                                                                                                   \
        ok_;                                                                                                \
    })

static void *pool_main(void *arg) {
    uint64_t seen = (uint64_t)(uintptr_t)arg; /* the run before the one it was started for */
    for (;;) {
        POOL_SPIN_UNTIL(atomic_load(&pool_gen) != seen); /* then take the lock either way */
        pthread_mutex_lock(&pool_mu);
        while (atomic_load(&pool_gen) == seen || pool_joined >= pool_want) {
            if (atomic_load(&pool_gen) != seen) seen = atomic_load(&pool_gen); /* it has its workers */
            pthread_cond_wait(&pool_wake, &pool_mu);
        }
        seen = atomic_load(&pool_gen);
        ++pool_joined;
        atomic_fetch_add(&pool_left, 1);
        pthread_mutex_unlock(&pool_mu);
        pool_work();
        pthread_mutex_lock(&pool_mu);
        if (atomic_fetch_sub(&pool_left, 1) == 1) pthread_cond_signal(&pool_done);
        pthread_mutex_unlock(&pool_mu);
    }
    return NULL;
}

static void pool_run(pool_fn fn, void *ctx, int64_t ntasks, int nthreads) {
    if (nthreads > POOL_MAX_THREADS) nthreads = POOL_MAX_THREADS;
    if (nthreads > ntasks) nthreads = (int)ntasks;
    if (nthreads <= 1 || pthread_mutex_trylock(&pool_busy) != 0) {
        for (int64_t t = 0; t < ntasks; ++t) fn(ctx, t);
        return;
    }
    pthread_once(&pool_once, pool_init);
    pthread_mutex_lock(&pool_mu);
    while (pool_started < nthreads - 1) { /* started before the run's number changes: it joins this run */
        pthread_t tid;
        if (pthread_create(&tid, NULL, pool_main, (void *)(uintptr_t)pool_gen) != 0) break;
        pthread_detach(tid);
        ++pool_started;
    }
    pool_job = fn;
    pool_ctx = ctx;
    pool_ntasks = ntasks;
    pool_chunk = (ntasks + nthreads - 1) / nthreads;
    atomic_store(&pool_next, 1); /* chunk 0 is the caller's */
    pool_want = nthreads - 1 < pool_started ? nthreads - 1 : pool_started;
    pool_joined = 0;
    atomic_fetch_add(&pool_gen, 1);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_mu);
    pool_run_chunk(0);
    pool_work();
    /* the tasks are all taken: the workers that joined finish theirs; none joins late */
    pthread_mutex_lock(&pool_mu);
    pool_want = 0;
    pthread_mutex_unlock(&pool_mu);
    if (!POOL_SPIN_UNTIL(atomic_load(&pool_left) == 0)) {
        pthread_mutex_lock(&pool_mu);
        while (atomic_load(&pool_left) > 0) pthread_cond_wait(&pool_done, &pool_mu);
        pthread_mutex_unlock(&pool_mu);
    }
    pthread_mutex_unlock(&pool_busy); /* the workers' writes came before their (seq_cst) pool_left update */
}

/* pool_run for another native library's kernels (opstrata.quant's int8 convolutions and GEMMs): the same
   persistent workers, so a process holds one pool whichever library's kernels split their work, and a call
   pays no thread start. */
void opstrata_pool_run(void (*fn)(void *, int64_t), void *ctx, int64_t ntasks, int nthreads) {
    pool_run(fn, ctx, ntasks, nthreads);
}

/* Independent items (image planes, channel blocks) split into chunks over the pool: fn(args, i0, i1) does
   items [i0, i1) with its own scratch; `work` is an item's cost in element operations, so that a small
   call stays on its thread (each thread >= RANGE_MIN_WORK). Returns 0, or the first failing chunk's code. */
#define RANGE_MIN_WORK (32 * 1024)
typedef int (*range_fn)(const void *args, int64_t i0, int64_t i1);
typedef struct {
    range_fn fn;
    const void *args;
    int64_t total, chunk;
    _Atomic int rc;
} range_job;

static void range_task(void *ctx, int64_t t) {
    range_job *j = (range_job *)ctx;
    const int64_t i0 = t * j->chunk, i1 = i0 + j->chunk < j->total ? i0 + j->chunk : j->total;
    const int rc = j->fn(j->args, i0, i1);
    if (rc) atomic_store(&j->rc, rc);
}

static int run_ranges(range_fn fn, const void *args, int64_t total, int64_t work, int64_t nthreads) {
    int64_t nt = nthreads < 1 ? 1 : nthreads;
    const int64_t fit = total * work / RANGE_MIN_WORK;
    if (nt > fit) nt = fit;
    if (nt <= 1 || total <= 1) return fn(args, 0, total);
    range_job j = {fn, args, total, 0, 0};
    const int64_t tasks = nt * 4 < total ? nt * 4 : total; /* a few chunks per thread: uneven cores even out */
    j.chunk = (total + tasks - 1) / tasks;
    pool_run(range_task, &j, (total + j.chunk - 1) / j.chunk, (int)nt);
    return atomic_load(&j.rc);
}

/* Depthwise 2-D convolution (groups == C_in == C_out, one kh x kw filter per channel), NCHW float32, zero
   padding (top pt, left pl; bottom/right implied by ho, wo), stride and dilation. Each channel plane is
   first copied into a zero-padded scratch plane split into sw column phases (phase q holds the padded
   columns q, q + sw, q + 2 sw, ...), so every tap of eight consecutive output columns is one unaligned
   vector load, at any stride, with no bounds check. An output value is its bias plus the kh * kw taps in
   row-major order, accumulated in float32; a last partial vector is computed whole (the scratch rows are
   VW columns longer) and stored in part. im2col + GEMM would copy the input kh * kw times to feed GEMMs
   of one row each. Returns 0, or -1 when the scratch plane cannot be allocated. */
/* The output rows of one depthwise plane from its phase-split scratch; always inlined so that the calls
   with a constant tap count (3x3, 5x5) unroll the tap loop and keep the filter in registers. */
static inline __attribute__((always_inline)) void dw_plane(const float *pad, const int64_t *tap,
                                                          const float *wk, float b0, float *op, int64_t ho,
                                                          int64_t wo, int64_t sh, int64_t wq, int64_t taps) {
    for (int64_t oh = 0; oh < ho; ++oh) {
        float *orow = op + oh * wo;
        const float *base = pad + oh * sh * wq;
        for (int64_t ow = 0; ow < wo; ow += VW) {
            vf acc = vsplat(b0);
            for (int64_t k = 0; k < taps; ++k) acc += vsplat(wk[k]) * vload(base + tap[k] + ow);
            if (wo - ow >= VW) /* a whole vector: one store (a copy of variable length is a library call) */
                memcpy(orow + ow, &acc, sizeof acc);
            else
                memcpy(orow + ow, &acc, (size_t)(wo - ow) * sizeof(float));
        }
    }
}

/* Planes narrower than a vector (wo < VW: a network's last stages, 7x7 down to 2x2) run VW channels at a
   time instead: the channels' pixels and taps transposed into lanes, each output the bias plus its
   in-image taps in row-major order (one vector multiply-add each), then scattered back. A row of such a
   plane would fill a fraction of one vector, and its scratch plane cost more than its arithmetic. */
typedef struct {
    const float *x, *w, *bias;
    float *out;
    int64_t n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo;
} dw_args;

/* items [i0, i1) of (image, block of VW channels) */
static int depthwise_by_channels(const void *args, int64_t i0, int64_t i1) {
    const dw_args *g = (const dw_args *)args;
    const int64_t c = g->c, h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, ho = g->ho, wo = g->wo;
    const int64_t pix = h * wd, taps = kh * kw, opix = ho * wo, blocks = (c + VW - 1) / VW;
    float *xt = (float *)malloc((size_t)((pix + taps + opix) * VW) * sizeof(float));
    if (!xt) return -1;
    float *wt = xt + pix * VW, *ot = wt + taps * VW;
    for (int64_t item = i0; item < i1; ++item) {
        const int64_t img = item / blocks, c0 = (item % blocks) * VW;
        const int64_t cn = c - c0 < VW ? c - c0 : VW;
        const float *xc = g->x + (img * c + c0) * pix;
        for (int64_t q = 0; q < pix; ++q)
            for (int64_t l = 0; l < VW; ++l) xt[q * VW + l] = l < cn ? xc[l * pix + q] : 0.0f;
        for (int64_t t = 0; t < taps; ++t)
            for (int64_t l = 0; l < VW; ++l) wt[t * VW + l] = l < cn ? g->w[(c0 + l) * taps + t] : 0.0f;
        vf b0 = vsplat(0.0f);
        if (g->bias)
            for (int64_t l = 0; l < cn; ++l) b0[l] = g->bias[c0 + l];
        for (int64_t oh = 0; oh < ho; ++oh) {
            for (int64_t ow = 0; ow < wo; ++ow) {
                vf acc = b0;
                for (int64_t i = 0; i < kh; ++i) {
                    const int64_t ih = oh * g->sh + i * g->dh - g->pt;
                    if (ih < 0 || ih >= h) continue;
                    for (int64_t j = 0; j < kw; ++j) {
                        const int64_t iw = ow * g->sw + j * g->dw - g->pl;
                        if (iw < 0 || iw >= wd) continue;
                        acc += vload(wt + (i * kw + j) * VW) * vload(xt + (ih * wd + iw) * VW);
                    }
                }
                memcpy(ot + (oh * wo + ow) * VW, &acc, sizeof acc);
            }
        }
        float *oc = g->out + (img * c + c0) * opix;
        for (int64_t l = 0; l < cn; ++l)
            for (int64_t q = 0; q < opix; ++q) oc[l * opix + q] = ot[q * VW + l];
    }
    free(xt);
    return 0;
}

/* planes [p0, p1) through the phase-split scratch */
static int depthwise_by_planes(const void *args, int64_t p0, int64_t p1) {
    const dw_args *g = (const dw_args *)args;
    const int64_t c = g->c, h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw;
    const int64_t dh = g->dh, dw = g->dw, pt = g->pt, pl = g->pl, ho = g->ho, wo = g->wo;
    const int64_t hp = (ho - 1) * sh + (kh - 1) * dh + 1; /* padded rows the taps read */
    const int64_t wp = (wo - 1) * sw + (kw - 1) * dw + 1; /* padded columns the taps read */
    const int64_t cols = (wp + sw - 1) / sw;              /* columns of a phase row */
    const int64_t wq = cols + VW;                         /* + a vector of slack for the last partial vector */
    const int64_t taps = kh * kw;
    float *pad = (float *)malloc((size_t)(sw * hp * wq) * sizeof(float));
    int64_t *tap = (int64_t *)malloc((size_t)taps * sizeof(int64_t));
    if (!pad || !tap) {
        free(pad);
        free(tap);
        return -1;
    }
    for (int64_t i = 0; i < kh; ++i) { /* where tap (i, j) of output (0, 0) sits in the phase-split scratch */
        for (int64_t j = 0; j < kw; ++j) tap[i * kw + j] = (((j * dw) % sw) * hp + i * dh) * wq + (j * dw) / sw;
    }
    for (int64_t p = p0; p < p1; ++p) {
        const float *xp = g->x + p * h * wd;
        const float *wk = g->w + (p % c) * taps;
        float *op = g->out + p * ho * wo;
        const float b0 = g->bias ? g->bias[p % c] : 0.0f;
        memset(pad, 0, (size_t)(sw * hp * wq) * sizeof(float));
        for (int64_t q = 0; q < sw; ++q) {
            /* phase column t holds padded column t * sw + q, i.e. input column t * sw + q - pl */
            int64_t t0 = pl - q > 0 ? (pl - q + sw - 1) / sw : 0;
            int64_t t1 = wd - 1 + pl - q >= 0 ? (wd - 1 + pl - q) / sw + 1 : 0;
            if (t1 > cols) t1 = cols;
            for (int64_t r = 0; r < hp; ++r) {
                const int64_t ih = r - pt;
                if (ih < 0 || ih >= h || t0 >= t1) continue;
                const float *src = xp + ih * wd + q - pl;
                float *dst = pad + (q * hp + r) * wq;
                if (sw == 1) {
                    memcpy(dst + t0, src + t0, (size_t)(t1 - t0) * sizeof(float));
                } else {
                    for (int64_t t = t0; t < t1; ++t) dst[t] = src[t * sw];
                }
            }
        }
        if (taps == 9) {
            dw_plane(pad, tap, wk, b0, op, ho, wo, sh, wq, 9);
        } else if (taps == 25) {
            dw_plane(pad, tap, wk, b0, op, ho, wo, sh, wq, 25);
        } else {
            dw_plane(pad, tap, wk, b0, op, ho, wo, sh, wq, taps);
        }
    }
    free(pad);
    free(tap);
    return 0;
}

/* planes (or, narrower than a vector, channel blocks) split over up to nthreads threads */
int opstrata_depthwise_conv2d_f32(const float *restrict x, const float *restrict w, const float *restrict bias,
                                  float *restrict out, int64_t n, int64_t c, int64_t h, int64_t wd, int64_t kh,
                                  int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                                  int64_t pl, int64_t ho, int64_t wo, int64_t nthreads) {
    const dw_args g = {x, w, bias, out, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo};
    if (wo < VW && c >= VW)
        return run_ranges(depthwise_by_channels, &g, n * ((c + VW - 1) / VW), VW * kh * kw * ho * wo, nthreads);
    return run_ranges(depthwise_by_planes, &g, n * c, kh * kw * ho * wo, nthreads);
}

/* im2col of one group of NCHW images: cols (G, Cg * kh * kw, ho * wo) per image, row (c, i, j) holding input
   channel c at tap (i, j) of every output position, zero where the tap falls in the padding -- numpy's
   sliding-window copy and the separate padded image in one pass. x is (n, c, h, w) C-contiguous; cols is
   (n, c * kh * kw, ho * wo): the GEMM of group g reads rows g * Cg * kh * kw onwards, as the numpy lowering
   lays them out. A stride-1 "same" row (wo == w) is the image shifted by one offset: one flat copy, then
   its padding rows and edge columns zeroed; other rows are copied output row by output row with inline
   loops (a memcpy call costs more than the handful of floats a small image's row holds). */
/* a windowed pass over planes (im2col, max pooling): input, output and the window's geometry */
typedef struct {
    const float *x;
    float *out;
    int64_t h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo;
} window_args;

/* planes [p0, p1) */
static int im2col_planes(const void *args, int64_t p0, int64_t p1) {
    const window_args *g = (const window_args *)args;
    const float *restrict x = g->x;
    float *restrict cols = g->out;
    const int64_t h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw, dh = g->dh, dw = g->dw;
    const int64_t pt = g->pt, pl = g->pl, ho = g->ho, wo = g->wo;
    const int64_t l = ho * wo;
    const int shifted = sh == 1 && sw == 1 && wo == wd;
    for (int64_t p = p0; p < p1; ++p) {
        const float *plane = x + p * h * wd;
        for (int64_t i = 0; i < kh; ++i) {
            /* output rows whose tap row i lands inside the image: oh in [r0, r1) */
            const int64_t roff = i * dh - pt;
            int64_t r0 = roff < 0 ? (-roff + sh - 1) / sh : 0;
            int64_t r1 = h - roff > 0 ? (h - roff + sh - 1) / sh : 0;
            if (r1 > ho) r1 = ho;
            if (r0 > r1) r0 = r1;
            for (int64_t j = 0; j < kw; ++j) {
                float *restrict row = cols + ((p * kh + i) * kw + j) * l;
                /* output columns whose tap j lands inside the image: ow in [o0, o1) */
                const int64_t off = j * dw - pl;
                int64_t o0 = off < 0 ? (-off + sw - 1) / sw : 0;
                int64_t o1 = wd - off > 0 ? (wd - off + sw - 1) / sw : 0;
                if (o1 > wo) o1 = wo;
                if (o0 > o1) o0 = o1;
                for (int64_t t = 0; t < r0 * wo; ++t) row[t] = 0.0f;
                for (int64_t t = r1 * wo; t < l; ++t) row[t] = 0.0f;
                if (r0 == r1) continue;
                if (shifted && o0 < o1) { /* dst[t] = plane[t + roff * wd + off] over the valid rows */
                    const int64_t t0 = r0 * wo + o0, t1 = (r1 - 1) * wo + o1;
                    const float *restrict src = plane + roff * wd + off;
                    for (int64_t t = t0; t < t1; ++t) row[t] = src[t];
                    for (int64_t oh = r0; oh < r1; ++oh) { /* the edge columns the flat copy filled */
                        float *restrict d = row + oh * wo;
                        for (int64_t ow = 0; ow < o0; ++ow) d[ow] = 0.0f;
                        for (int64_t ow = o1; ow < wo; ++ow) d[ow] = 0.0f;
                    }
                    if (o0 > 0) /* the first valid row's leading edge lies before t0 */
                        for (int64_t ow = 0; ow < o0; ++ow) row[r0 * wo + ow] = 0.0f;
                    continue;
                }
                for (int64_t oh = r0; oh < r1; ++oh) {
                    float *restrict d = row + oh * wo;
                    const float *restrict src = plane + (oh * sh + roff) * wd + off;
                    for (int64_t ow = 0; ow < o0; ++ow) d[ow] = 0.0f;
                    if (sw == 1) {
                        for (int64_t ow = o0; ow < o1; ++ow) d[ow] = src[ow];
                    } else {
                        for (int64_t ow = o0; ow < o1; ++ow) d[ow] = src[ow * sw];
                    }
                    for (int64_t ow = o1; ow < wo; ++ow) d[ow] = 0.0f;
                }
            }
        }
    }
    return 0;
}

/* Narrow images (output rows shorter than a vector: a network's last stages) spend im2col's time on loop
   bounds, not copies: each plane's kh * kw * ho * wo column entries are gathered instead through one table
   of in-plane offsets (-1: padding), built once per call. */
#define IM2COL_GATHER_MAX_WO 8
#define IM2COL_GATHER_MAX_TAPS 4096
typedef struct {
    const float *x;
    float *out;
    const int32_t *idx;
    int64_t plane, taps; /* floats per input plane; table entries (one plane's columns) */
} gather_args;

static int im2col_gather_planes(const void *args, int64_t p0, int64_t p1) {
    const gather_args *g = (const gather_args *)args;
    const int32_t *restrict idx = g->idx;
    for (int64_t p = p0; p < p1; ++p) {
        const float *restrict plane = g->x + p * g->plane;
        float *restrict dst = g->out + p * g->taps;
        for (int64_t t = 0; t < g->taps; ++t) dst[t] = idx[t] >= 0 ? plane[idx[t]] : 0.0f;
    }
    return 0;
}

void opstrata_im2col_f32(const float *restrict x, float *restrict cols, int64_t n, int64_t c, int64_t h,
                         int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                         int64_t pt, int64_t pl, int64_t ho, int64_t wo, int64_t nthreads) {
    const int64_t taps = kh * kw * ho * wo;
    if (wo < IM2COL_GATHER_MAX_WO && taps <= IM2COL_GATHER_MAX_TAPS && h * wd < INT32_MAX) {
        int32_t idx[IM2COL_GATHER_MAX_TAPS];
        int64_t t = 0;
        for (int64_t i = 0; i < kh; ++i)
            for (int64_t j = 0; j < kw; ++j)
                for (int64_t oh = 0; oh < ho; ++oh)
                    for (int64_t ow = 0; ow < wo; ++ow, ++t) {
                        const int64_t r = oh * sh + i * dh - pt, q = ow * sw + j * dw - pl;
                        idx[t] = r >= 0 && r < h && q >= 0 && q < wd ? (int32_t)(r * wd + q) : -1;
                    }
        const gather_args g = {x, cols, idx, h * wd, taps};
        run_ranges(im2col_gather_planes, &g, n * c, taps, nthreads);
        return;
    }
    const window_args g = {x, cols, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo};
    run_ranges(im2col_planes, &g, n * c, kh * kw * ho * wo, nthreads);
}

/* ---------------------------------------------------------------------------------------------------
   The convolution GEMM: c = bias[row] + a @ b for row-major a (m, k), b (k, n), c (m, n), over `batch`
   matrices (element strides sa / sb / sc; sa = 0 shares a). Each output is one chain of fused
   multiply-adds over k in order, starting from its bias (or 0), so its bits do not depend on the tiling,
   the vector width or how work is split: the AVX-512 tiles, their remainders and the portable loop all
   give the same result. The fast path is the AVX-512 register tile (rows of a broadcast, 16- or 32-column
   strips of b loaded as they lie: the im2col columns need no packing); without AVX-512 the library says
   so (opstrata_sgemm_fma_fast) and the caller keeps the BLAS.
   ------------------------------------------------------------------------------------------------- */
/* An activation applied to each output as it is stored (FusedConv's epilogue run in the GEMM instead of a
   pass of its own): the elementwise VM's instructions, the same IEEE operations in the same order, so the
   bits are those of the unfused conv + epilogue. kind 0 none; 1 ReLU (h < 0 ? 0 : h, NaN kept); 2 clip:
   min(max(h, c0), c1) with the VM's NaN-propagating Max / Min; 3 the hard-swish form exporters write,
   h * min(max(h * c0 + c1, c2), c3), the product and the sum each rounded (no FMA contraction); 4 a
   residual added, h + r (r: a tensor laid out as c, at c's address + rdelta); 5 the residual added, then
   ReLU (ResNet's Add + Relu). */
typedef struct {
    int64_t kind;
    float c0, c1, c2, c3;
    int64_t rdelta;
} sg_epi;

/* The epilogue an entry point's act / params / res describe (res laid out as the output c): 0, or -3 for
   an unknown kind or its missing constants / residual. */
static int sg_epi_from(int64_t act, const float *params, const float *res, const float *c, sg_epi *e) {
    if (act < 0 || act > 5 || ((act == 2 || act == 3) && !params) || ((act == 4 || act == 5) && !res)) return -3;
    *e = (sg_epi){act, 0.0f, 0.0f, 0.0f, 0.0f, res ? res - c : 0};
    if (params) {
        e->c0 = params[0];
        e->c1 = params[1];
        e->c2 = params[2];
        e->c3 = params[3];
    }
    return 0;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* the epilogue on 16 lanes: max_ps(c, h) is "c > h ? c : h", i.e. the VM's max_nan(h, c) (a NaN h, or h
   equal to c, gives h), min_ps(c, h) likewise its min_nan(h, c); the *_round_ps forms are builtins the
   compiler never contracts into an FMA */
static inline __attribute__((always_inline)) __m512 sg_epi_apply(__m512 h, int kind, const sg_epi *e,
                                                                 const float *at, __mmask16 m) {
    switch (kind) {
    case 1:
        return _mm512_max_ps(_mm512_setzero_ps(), h);
    case 4:
        return _mm512_add_ps(h, _mm512_maskz_loadu_ps(m, at + e->rdelta));
    case 5:
        return _mm512_max_ps(_mm512_setzero_ps(), _mm512_add_ps(h, _mm512_maskz_loadu_ps(m, at + e->rdelta)));
    case 2:
        return _mm512_min_ps(_mm512_set1_ps(e->c1), _mm512_max_ps(_mm512_set1_ps(e->c0), h));
    case 3: {
        __m512 t = _mm512_mul_round_ps(h, _mm512_set1_ps(e->c0), _MM_FROUND_CUR_DIRECTION);
        t = _mm512_add_round_ps(t, _mm512_set1_ps(e->c1), _MM_FROUND_CUR_DIRECTION);
        t = _mm512_min_ps(_mm512_set1_ps(e->c3), _mm512_max_ps(_mm512_set1_ps(e->c2), t));
        return _mm512_mul_round_ps(t, h, _MM_FROUND_CUR_DIRECTION);
    }
    default:
        return h;
    }
}

/* the epilogue of kind EK (a compile-time constant in each instantiation of a tile) on accumulator H */
#define SG_EPI(H, AT, M) sg_epi_apply(H, EK, e, AT, M)

/* rows [0, MR) x columns [0, 32) (masks m0 / m1 cut the last strip) of c */
#define SG_TILE2(MR)                                                                                        \
    static inline __attribute__((always_inline)) void sg_tile2_##MR(                                       \
        const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int64_t k,         \
        const float *bias, __mmask16 m0, __mmask16 m1, const sg_epi *e, const int EK) {                     \
        __m512 x0[MR], x1[MR];                                                                              \
        for (int i = 0; i < MR; ++i) x0[i] = x1[i] = _mm512_set1_ps(bias ? bias[i] : 0.0f);                 \
        for (int64_t p = 0; p < k; ++p) {                                                                   \
            const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);                                        \
            const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + p * ldb + 16);                                   \
            for (int i = 0; i < MR; ++i) {                                                                  \
                const __m512 ai = _mm512_set1_ps(a[i * lda + p]);                                           \
                x0[i] = _mm512_fmadd_ps(ai, b0, x0[i]);                                                     \
                x1[i] = _mm512_fmadd_ps(ai, b1, x1[i]);                                                     \
            }                                                                                               \
        }                                                                                                   \
        for (int i = 0; i < MR; ++i) {                                                                      \
            _mm512_mask_storeu_ps(c + i * ldc, m0, SG_EPI(x0[i], c + i * ldc, m0));                         \
            _mm512_mask_storeu_ps(c + i * ldc + 16, m1, SG_EPI(x1[i], c + i * ldc + 16, m1));               \
        }                                                                                                   \
    }
/* rows [0, MR) x columns [0, 48) (masks m0 / m1 / m2) of c: a last strip of 33 to 48 columns (a 1- to
   16-column remainder joined to the strip before it, instead of a narrow tile of its own: one vector wide,
   its broadcasts outnumber its multiply-adds' share of the load ports) */
#define SG_TILE3(MR)                                                                                        \
    static inline __attribute__((always_inline)) void sg_tile3_##MR(                                       \
        const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc, int64_t k,         \
        const float *bias, __mmask16 m0, __mmask16 m1, __mmask16 m2, const sg_epi *e, const int EK) {       \
        __m512 x0[MR], x1[MR], x2[MR];                                                                      \
        for (int i = 0; i < MR; ++i) x0[i] = x1[i] = x2[i] = _mm512_set1_ps(bias ? bias[i] : 0.0f);         \
        for (int64_t p = 0; p < k; ++p) {                                                                   \
            const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);                                        \
            const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + p * ldb + 16);                                   \
            const __m512 b2 = _mm512_maskz_loadu_ps(m2, b + p * ldb + 32);                                   \
            for (int i = 0; i < MR; ++i) {                                                                  \
                const __m512 ai = _mm512_set1_ps(a[i * lda + p]);                                           \
                x0[i] = _mm512_fmadd_ps(ai, b0, x0[i]);                                                     \
                x1[i] = _mm512_fmadd_ps(ai, b1, x1[i]);                                                     \
                x2[i] = _mm512_fmadd_ps(ai, b2, x2[i]);                                                     \
            }                                                                                               \
        }                                                                                                   \
        for (int i = 0; i < MR; ++i) {                                                                      \
            _mm512_mask_storeu_ps(c + i * ldc, m0, SG_EPI(x0[i], c + i * ldc, m0));                         \
            _mm512_mask_storeu_ps(c + i * ldc + 16, m1, SG_EPI(x1[i], c + i * ldc + 16, m1));               \
            _mm512_mask_storeu_ps(c + i * ldc + 32, m2, SG_EPI(x2[i], c + i * ldc + 32, m2));               \
        }                                                                                                   \
    }
SG_TILE2(12)
SG_TILE2(8)
SG_TILE2(4)
SG_TILE2(1)
SG_TILE3(8)
SG_TILE3(4)
SG_TILE3(1)
#undef SG_TILE2
#undef SG_TILE3

static inline __mmask16 sg_mask(int64_t cols) {
    return cols >= 16 ? (__mmask16)0xFFFF : cols <= 0 ? (__mmask16)0 : (__mmask16)((1u << cols) - 1u);
}

/* strips of n columns: 32 wide, but a remainder of 1 to 16 columns after whole strips joins the last one
   (33 to 48 wide, one 3-vector tile) */
static inline int64_t sg_strips(int64_t n) {
    const int64_t s = (n + 31) / 32;
    return n > 32 && n % 32 >= 1 && n % 32 <= 16 ? s - 1 : s;
}
static inline int64_t sg_strip_width(int64_t n, int64_t strip) {
    return strip == sg_strips(n) - 1 ? n - strip * 32 : 32;
}

/* Epilogues that need more registers than the tiles leave (hard-swish's four constants, the residual's
   loads: kinds 3-5) run over a tile's rows just after it stores them, while they are in L1: with them inside
   the tiles the compiler spilled accumulators and the tiles ran ~1.8x slower. Same operations on the same
   values, so the same bits. TILE_EK: the kind the tiles themselves apply. */
#define TILE_EK(EK) ((EK) >= 3 ? 0 : (EK))
static inline __attribute__((always_inline)) void sg_epi_after(float *c, int64_t ldc, int64_t rows, int64_t w,
                                                              const sg_epi *e, const int EK) {
    if (EK < 3) return;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t v = 0; v * 16 < w; ++v) {
            float *at = c + r * ldc + 16 * v;
            const __mmask16 m = sg_mask(w - 16 * v);
            _mm512_mask_storeu_ps(at, m, sg_epi_apply(_mm512_maskz_loadu_ps(m, at), EK, e, at, m));
        }
}

/* Narrow products (n <= SG_DOT_MAX_N: a network's last stages, 4x4 and 2x2 images): dot products along k
   over rows of a streamed once, in order (the weights are the traffic there), against b transposed into
   bt (n, k). Lane l of an accumulator chains the terms p = l (mod 16) in order; the 16 lanes are then
   summed pairwise in a fixed order and the bias added: fixed bits per shape, as the strip tiles. */
#define SG_DOT_MAX_N 16
#define SG_DOT_PREFETCH 512 /* floats ahead on each weight row: few rows stream at once, so the hardware
                                    prefetcher alone leaves memory latency exposed */
static inline float sg_hsum(__m512 v) { /* fixed pairwise order: halves, quarters, ... */
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
#define SG_DOT_STEP(R, C, M)                                                                                \
    {                                                                                                       \
        __m512 av[R], bv[C];                                                                                \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; ++i) {                                               \
            av[i] = _mm512_maskz_loadu_ps(M, a + i * lda + p);                                              \
            _mm_prefetch((const char *)(a + i * lda + p + SG_DOT_PREFETCH), _MM_HINT_T0);                   \
        }                                                                                                   \
        _Pragma("GCC unroll 8") for (int j = 0; j < C; ++j) bv[j] = _mm512_maskz_loadu_ps(M, bt + j * k + p);  \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; ++i)                                                 \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; ++j) acc[i][j] = _mm512_fmadd_ps(av[i], bv[j], acc[i][j]); \
    }
#define SG_DOT(R, C)                                                                                        \
    static inline __attribute__((always_inline)) void sg_dot_##R##x##C(                                    \
        const float *a, int64_t lda, const float *bt, float *c, int64_t ldc, int64_t k, const float *bias) { \
        __m512 acc[R][C];                                                                                   \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; ++i)                                                 \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; ++j) acc[i][j] = _mm512_setzero_ps();            \
        int64_t p = 0;                                                                                      \
        for (; p + 16 <= k; p += 16) SG_DOT_STEP(R, C, (__mmask16)0xFFFF)                                    \
        if (p < k) {                                                                                        \
            const __mmask16 tail = (__mmask16)((1u << (k - p)) - 1u);                                       \
            SG_DOT_STEP(R, C, tail)                                                                         \
        }                                                                                                   \
        _Pragma("GCC unroll 8") for (int i = 0; i < R; ++i)                                                 \
            _Pragma("GCC unroll 8") for (int j = 0; j < C; ++j)                                             \
                c[i * ldc + j] = sg_hsum(acc[i][j]) + (bias ? bias[i] : 0.0f);                             \
    }
SG_DOT(2, 8)
SG_DOT(4, 4)
SG_DOT(4, 2)
SG_DOT(4, 1)
SG_DOT(1, 8)
SG_DOT(1, 4)
SG_DOT(1, 2)
SG_DOT(1, 1)
#undef SG_DOT
#undef SG_DOT_STEP

/* rows [i0, i1) (at most 4, resident in cache while every column block reads them) x column blocks of
   C = 8, 4, 2, 1, rows in blocks of R then one by one */
#define SG_DOT_COLS(R, C)                                                                                   \
    for (; j + C <= n; j += C) {                                                                            \
        int64_t i = i0;                                                                                     \
        for (; i + R <= i1; i += R)                                                                         \
            sg_dot_##R##x##C(a + i * lda, lda, bt + j * k, c + i * ldc + j, ldc, k, bias ? bias + i : NULL);  \
        for (; i < i1; ++i)                                                                                 \
            sg_dot_1x##C(a + i * lda, lda, bt + j * k, c + i * ldc + j, ldc, k, bias ? bias + i : NULL);      \
    }
/* rows [i0, i1) of the narrow product against bt (n, k) */
static void sg_dot_rows(const float *a, const float *bt, float *c, int64_t i0, int64_t i1, int64_t n, int64_t k,
                        int64_t lda, int64_t ldc, const float *bias, const sg_epi *e) {
    int64_t j = 0;
    SG_DOT_COLS(2, 8)
    SG_DOT_COLS(4, 4)
    SG_DOT_COLS(4, 2)
    SG_DOT_COLS(4, 1)
    if (e && e->kind) { /* the rows are complete and cache-hot: n <= 16 columns, one masked vector each */
        const __mmask16 m = sg_mask(n);
        for (int64_t i = i0; i < i1; ++i) {
            float *ci = c + i * ldc;
            _mm512_mask_storeu_ps(ci, m, sg_epi_apply(_mm512_maskz_loadu_ps(m, ci), (int)e->kind, e, ci, m));
        }
    }
}
#undef SG_DOT_COLS

/* rows [i0, i1) of strip j / 32 (see sg_strips) */
static inline __attribute__((always_inline)) void sg_strip_rows_k(const float *a, const float *b, float *c, int64_t i0,
                                                                   int64_t i1, int64_t j, int64_t n, int64_t k,
                                                                   int64_t lda, int64_t ldb, int64_t ldc,
                                                                   const float *bias, const sg_epi *e, const int EK) {
    const int64_t w = sg_strip_width(n, j / 32);
    const float *bj = b + j;
    float *cj = c + j;
    int64_t i = i0;
/* tile TILE of MR rows at row i (masks ...), then the epilogue the tile left to the pass after it */
#define SG_T(TILE, MR, ...)                                                                                 \
    do {                                                                                                    \
        TILE(a + i * lda, lda, bj, ldb, cj + i * ldc, ldc, k, bias ? bias + i : NULL, __VA_ARGS__, e, TILE_EK(EK)); \
        sg_epi_after(cj + i * ldc, ldc, MR, w, e, EK);                                                      \
    } while (0)
    if (w <= 32) {
        const __mmask16 m0 = sg_mask(w), m1 = sg_mask(w - 16);
        /* 12-row tiles, the rest in 8s, 4s and 1s; 12 + 4 rows go as 8 + 8 (a 4-row tile has too few
           accumulators to hide the multiply-add latency) */
        int64_t twelves = (i1 - i) / 12;
        if ((i1 - i) % 12 == 4 && twelves > 0) --twelves;
        for (; twelves > 0; --twelves, i += 12) SG_T(sg_tile2_12, 12, m0, m1);
        for (; i + 8 <= i1; i += 8) SG_T(sg_tile2_8, 8, m0, m1);
        for (; i + 4 <= i1; i += 4) SG_T(sg_tile2_4, 4, m0, m1);
        for (; i < i1; ++i) SG_T(sg_tile2_1, 1, m0, m1);
    } else {
        const __mmask16 m2 = sg_mask(w - 32);
        for (; i + 8 <= i1; i += 8) SG_T(sg_tile3_8, 8, 0xFFFF, 0xFFFF, m2);
        for (; i + 4 <= i1; i += 4) SG_T(sg_tile3_4, 4, 0xFFFF, 0xFFFF, m2);
        for (; i < i1; ++i) SG_T(sg_tile3_1, 1, 0xFFFF, 0xFFFF, m2);
    }
#undef SG_T
}

/* the strip rows with the epilogue's kind a constant in each copy: the tiles' store loops stay small enough to
   unroll, so their accumulators stay in registers */
static void sg_strip_rows(const float *a, const float *b, float *c, int64_t i0, int64_t i1, int64_t j, int64_t n,
                          int64_t k, int64_t lda, int64_t ldb, int64_t ldc, const float *bias, const sg_epi *e) {
#define SG_STRIP_K(K) sg_strip_rows_k(a, b, c, i0, i1, j, n, k, lda, ldb, ldc, bias, e, K)
    switch (e ? e->kind : 0) {
    case 1: SG_STRIP_K(1); break;
    case 2: SG_STRIP_K(2); break;
    case 3: SG_STRIP_K(3); break;
    case 4: SG_STRIP_K(4); break;
    case 5: SG_STRIP_K(5); break;
    default: SG_STRIP_K(0); break;
    }
#undef SG_STRIP_K
}

/* one product split into tasks: row blocks of the narrow form, or (strip, row block) pairs of the wide one */
typedef struct {
    const float *a, *b, *bt, *bias;
    float *c;
    int64_t m, n, k, lda, ldb, ldc, rows, blocks; /* rows per task; row blocks per strip */
    const sg_epi *epi;
} sg_job;

static void sg_task(void *ctx, int64_t t) {
    const sg_job *g = (const sg_job *)ctx;
    const int64_t blk = g->bt ? t : t % g->blocks;
    const int64_t i0 = blk * g->rows, i1 = i0 + g->rows < g->m ? i0 + g->rows : g->m;
    if (g->bt)
        sg_dot_rows(g->a, g->bt, g->c, i0, i1, g->n, g->k, g->lda, g->ldc, g->bias, g->epi);
    else
        sg_strip_rows(g->a, g->b, g->c, i0, i1, (t / g->blocks) * 32, g->n, g->k, g->lda, g->ldb, g->ldc, g->bias,
                      g->epi);
}

/* multiply-adds one more thread must get before the product is split (a pool run costs a few us) */
#define SG_MIN_MACS_PER_THREAD (1 << 18)

/* the threads a product of `macs` multiply-adds splits over: at most nthreads, each getting enough work */
static inline int sg_threads(int64_t macs, int nthreads) {
    const int nt = nthreads < 1 ? 1 : nthreads;
    if (nt == 1 || macs / nt >= SG_MIN_MACS_PER_THREAD) return nt;
    const int64_t fit = macs / SG_MIN_MACS_PER_THREAD;
    return fit > 1 ? (int)fit : 1;
}

static int sgemm_fma_one(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k, int64_t lda,
                         int64_t ldb, int64_t ldc, const float *bias, int nthreads, const sg_epi *epi) {
    const int64_t macs = m * n * k;
    const int nt = sg_threads(macs, nthreads);
    sg_job g = {a, b, NULL, bias, c, m, n, k, lda, ldb, ldc, 0, 0, epi && epi->kind ? epi : NULL};
    if (n <= SG_DOT_MAX_N) {
        float *bt = (float *)malloc((size_t)(n * k) * sizeof(float));
        if (!bt) return -1;
        for (int64_t p = 0; p < k; ++p)
            for (int64_t j = 0; j < n; ++j) bt[j * k + p] = b[p * ldb + j];
        g.bt = bt;
        g.rows = 4; /* the weights stream from memory once: four rows stay cached while every column reads them */
        pool_run(sg_task, &g, (m + 3) / 4, nt);
        free(bt);
        return 0;
    }
    const int64_t strips = sg_strips(n);
    /* whole strips per task when there are enough of them, else strips cut into row blocks of 24 */
    g.rows = nt > 1 && strips < 4 * nt ? 24 : m;
    g.blocks = (m + g.rows - 1) / g.rows;
    pool_run(sg_task, &g, strips * g.blocks, nt);
    return 0;
}
/* ---------------------------------------------------------------------------------------------------
   Direct convolution for stride-1 "same-width" layers (output width == input width: the 3x3 pad-1 layers of
   ResNet, SqueezeNet, VGG), NCHW float32: the im2col GEMM without the columns. Output position t = oh * w + ow
   of a plane reads, for kernel tap (i, j), input position t + (i * dh - pt) * w + (j * dw - pl) -- one fixed
   offset per tap -- when that tap lies inside the image, else 0: so a 16-lane strip of the columns im2col
   would write is one masked load from the image itself (masked lanes read nothing; their zeros are the
   padding). The tiles are the strip GEMM's with that load: the same multiply-add chain per output, over
   k = (channel, i, j) in order from its bias, with the same zeros -- the same bits as im2col + the strip
   GEMM -- but no columns are written and read back (9x the image for a 3x3, written then read cold).
   The weights come packed by the caller (opstrata.ops.native.kernels._direct_weights): per group, rows in
   panels of 4, each panel (k, 4) -- a tile's weights for one k lie in MR / 4 short runs that stream in
   order -- and the last og % 4 rows as one (k, og % 4) panel.
   ------------------------------------------------------------------------------------------------- */
#define DC_MAX_TAPS 64
typedef struct {
    const float *wp, *x, *bias; /* wp: the packed weights of one group */
    float *c;
    int64_t m, l, cg, h, wd, kh, kw, dh, dw, pt, pl, rows, blocks;
    const sg_epi *epi;
} dc_job;

/* each tap's offset and the lanes of the (up to) 48 columns from t0 it reads inside the image (mk[3 * tap + v]:
   vector v's lanes). Rows and columns of the 48 positions built by stepping (no division per lane), each
   tap's lanes by four vector compares: this runs once per (strip, row block) task, and done lane by lane
   it cost ~0.8 us, ~20% of a small layer's time at one thread and ~40% at two. */
static void dc_taps(const dc_job *g, int64_t t0, int64_t w, int64_t *off, __mmask16 *mk) {
    const int64_t wd = g->wd;
    int32_t row[48], col[48];
    int64_t r = t0 / wd, c = t0 % wd;
    for (int64_t lane = 0; lane < 48; ++lane) {
        row[lane] = (int32_t)r;
        col[lane] = (int32_t)c;
        if (++c == wd) {
            c = 0;
            ++r;
        }
    }
    const __m512i hv = _mm512_set1_epi32((int32_t)g->h), wv = _mm512_set1_epi32((int32_t)wd);
    const __m512i zero = _mm512_setzero_si512();
    __mmask16 live[3];
    for (int v = 0; v < 3; ++v) live[v] = sg_mask(w - 16 * v);
    for (int64_t i = 0; i < g->kh; ++i)
        for (int64_t j = 0; j < g->kw; ++j) {
            const int64_t tap = i * g->kw + j, ro = i * g->dh - g->pt, co = j * g->dw - g->pl;
            const __m512i rov = _mm512_set1_epi32((int32_t)ro), cov = _mm512_set1_epi32((int32_t)co);
            for (int v = 0; v < 3; ++v) {
                const __m512i rr = _mm512_add_epi32(_mm512_loadu_si512(row + 16 * v), rov);
                const __m512i qq = _mm512_add_epi32(_mm512_loadu_si512(col + 16 * v), cov);
                __mmask16 m = _mm512_mask_cmpge_epi32_mask(live[v], rr, zero);
                m = _mm512_mask_cmplt_epi32_mask(m, rr, hv);
                m = _mm512_mask_cmpge_epi32_mask(m, qq, zero);
                mk[3 * tap + v] = _mm512_mask_cmplt_epi32_mask(m, qq, wv);
            }
            off[tap] = ro * wd + co;
        }
}

/* the weight of tile row I (a compile-time constant) at step p: panels of 4 (`panel` floats apart, k-step
   4), or for a one-row tile its own run with k-step ks */
#define DC_W(MR, I) ((MR) == 1 ? ap[p * ks] : ap[((I) >> 2) * panel + p * 4 + ((I) & 3)])

/* rows [0, MR) x NV vectors of 16 columns from xs's position (stores masked by sm[v]) */
#define DC_TILE(NV, MR)                                                                                     \
    static inline __attribute__((always_inline)) void dc_tile##NV##_##MR(                                  \
        const float *ap, int64_t panel, int64_t ks, const float *xs, int64_t plane, int64_t cg,             \
        int64_t taps, const int64_t *off, const __mmask16 *mk, float *c, int64_t ldc, const float *bias,     \
        const __mmask16 *sm, const sg_epi *e, const int EK) {                                               \
        __m512 acc[NV][MR];                                                                                 \
        for (int i = 0; i < MR; ++i)                                                                        \
            for (int v = 0; v < NV; ++v) acc[v][i] = _mm512_set1_ps(bias ? bias[i] : 0.0f);                 \
        int64_t p = 0;                                                                                      \
        for (int64_t ci = 0; ci < cg; ++ci) {                                                               \
            const float *xc = xs + ci * plane;                                                              \
            for (int64_t tp = 0; tp < taps; ++tp, ++p) {                                                    \
                __m512 bv[NV];                                                                              \
                for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(mk[3 * tp + v], xc + off[tp] + 16 * v); \
                for (int i = 0; i < MR; ++i) {                                                              \
                    const __m512 ai = _mm512_set1_ps(DC_W(MR, i));                                          \
                    for (int v = 0; v < NV; ++v) acc[v][i] = _mm512_fmadd_ps(ai, bv[v], acc[v][i]);         \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int i = 0; i < MR; ++i)                                                                        \
            for (int v = 0; v < NV; ++v)                                                                    \
                _mm512_mask_storeu_ps(c + i * ldc + 16 * v, sm[v], SG_EPI(acc[v][i], c + i * ldc + 16 * v, sm[v])); \
    }
DC_TILE(2, 12)
DC_TILE(2, 8)
DC_TILE(2, 4)
DC_TILE(2, 1)
DC_TILE(3, 8)
DC_TILE(3, 4)
DC_TILE(3, 1)
#undef DC_TILE
#undef DC_W

/* rows [i0, i1) of strip t0 / 32 (sg_strips' strips), in the strip GEMM's row blocks (i0 a multiple of 4) */
static inline __attribute__((always_inline)) void dc_strip_rows_k(const dc_job *g, int64_t i0, int64_t i1,
                                                                   int64_t t0, const int EK) {
    int64_t off[DC_MAX_TAPS];
    __mmask16 mk[3 * DC_MAX_TAPS];
    const int64_t w = sg_strip_width(g->l, t0 / 32), l = g->l, taps = g->kh * g->kw, cg = g->cg;
    dc_taps(g, t0, w, off, mk);
    const int64_t plane = g->h * g->wd, k = cg * taps, panel = 4 * k, full = g->m & ~(int64_t)3;
    const int64_t tail = g->m - full; /* rows in the last, narrower panel */
    const float *wp = g->wp, *xs = g->x + t0, *bias = g->bias;
    float *c = g->c + t0;
    const sg_epi *e = g->epi;
    const __mmask16 sm[3] = {sg_mask(w), sg_mask(w - 16), sg_mask(w - 32)};
    int64_t i = i0;
/* tile row I's packed weights: its panel's run (k-step 4), or the tail panel's (k-step `tail`) */
#define DC_A(I) ((I) < full ? wp + ((I) >> 2) * panel + ((I) & 3) : wp + full * k + ((I) - full)), panel, \
                ((I) < full ? 4 : tail)
#define DC_REST(I) xs, plane, cg, taps, off, mk, c + (I) * l, l, bias ? bias + (I) : NULL, sm, e, TILE_EK(EK)
/* tile TILE of MR rows at row i, then the epilogue the tile left to the pass after it */
#define DC_T(TILE, MR)                                                                                      \
    do {                                                                                                    \
        TILE(DC_A(i), DC_REST(i));                                                                          \
        sg_epi_after(c + i * l, l, MR, w, e, EK);                                                           \
    } while (0)
    if (w <= 32) {
        int64_t twelves = (i1 - i) / 12;
        if ((i1 - i) % 12 == 4 && twelves > 0) --twelves;
        for (; twelves > 0; --twelves, i += 12) DC_T(dc_tile2_12, 12);
        for (; i + 8 <= i1; i += 8) DC_T(dc_tile2_8, 8);
        for (; i + 4 <= i1; i += 4) DC_T(dc_tile2_4, 4);
        for (; i < i1; ++i) DC_T(dc_tile2_1, 1);
    } else {
        for (; i + 8 <= i1; i += 8) DC_T(dc_tile3_8, 8);
        for (; i + 4 <= i1; i += 4) DC_T(dc_tile3_4, 4);
        for (; i < i1; ++i) DC_T(dc_tile3_1, 1);
    }
#undef DC_T
#undef DC_A
#undef DC_REST
}

static void dc_task(void *ctx, int64_t t) {
    const dc_job *g = (const dc_job *)ctx;
    const int64_t blk = t % g->blocks, i0 = blk * g->rows, i1 = i0 + g->rows < g->m ? i0 + g->rows : g->m;
    const int64_t t0 = (t / g->blocks) * 32;
#define DC_STRIP_K(K) dc_strip_rows_k(g, i0, i1, t0, K)
    switch (g->epi ? g->epi->kind : 0) {
    case 1: DC_STRIP_K(1); break;
    case 2: DC_STRIP_K(2); break;
    case 3: DC_STRIP_K(3); break;
    case 4: DC_STRIP_K(4); break;
    case 5: DC_STRIP_K(5); break;
    default: DC_STRIP_K(0); break;
    }
#undef DC_STRIP_K
}

static int conv_direct_one(const float *x, const float *wp, const float *bias, float *out, int64_t og, int64_t cg,
                           int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t dh, int64_t dw, int64_t pt,
                           int64_t pl, int64_t ho, int nthreads, const sg_epi *epi) {
    const int64_t l = ho * wd, k = cg * kh * kw, macs = og * l * k;
    const int nt = sg_threads(macs, nthreads);
    dc_job g = {wp, x, bias, out, og, l, cg, h, wd, kh, kw, dh, dw, pt, pl, 0, 0, epi};
    const int64_t strips = sg_strips(l);
    g.rows = nt > 1 && strips < 4 * nt ? 24 : og; /* row blocks of 24 keep every block's start a multiple of 4 */
    g.blocks = (og + g.rows - 1) / g.rows;
    pool_run(dc_task, &g, strips * g.blocks, nt);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
   Strided (and other not-same-width) convolutions, NCHW float32: the strip GEMM with each 32-column strip's
   columns gathered from the image just before its tiles use them (a K x 48 panel per thread, in L1/L2),
   instead of an im2col buffer for the whole image that the GEMM then reads back cold -- across cores when
   threads split it. Lane l of a strip is output position t0 + l, at input offset base[l] = (oh sh) w + ow sw;
   tap (i, j) adds (i dh - pt) w + j dw - pl, its lanes inside the image gathered (the rest 0, the
   padding). Same columns, same tiles, so the same bits as im2col + the strip GEMM. Threads take whole
   strips, or row blocks of them when there are fewer strips than threads (a panel gathered per task).
   ------------------------------------------------------------------------------------------------- */
typedef struct {
    const float *a, *x, *bias; /* a: the weights (og, k) as they lie */
    float *c;
    int64_t m, l, cg, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, wo, rows, blocks;
    const sg_epi *epi;
    _Atomic int failed; /* a panel could not be allocated */
} gs_job;

/* a thread's panel, kept for its next call (grown as needed; a workspace like BLAS's, never freed) */
static __thread float *gs_panel;
static __thread int64_t gs_panel_floats;

static float *gs_panel_for(int64_t floats) {
    if (floats > gs_panel_floats) {
        float *p = (float *)realloc(gs_panel, (size_t)floats * sizeof(float));
        if (!p) return NULL;
        gs_panel = p;
        gs_panel_floats = floats;
    }
    return gs_panel;
}

static void gs_task(void *ctx, int64_t task) {
    gs_job *g = (gs_job *)ctx;
    const int64_t s = task / g->blocks, i0 = (task % g->blocks) * g->rows;
    const int64_t i1 = i0 + g->rows < g->m ? i0 + g->rows : g->m;
    const int64_t t0 = s * 32, w = sg_strip_width(g->l, s), taps = g->kh * g->kw, k = g->cg * taps;
    float *panel = gs_panel_for(k * 48);
    if (!panel) {
        atomic_store(&g->failed, 1);
        return;
    }
    const int64_t h = g->h, wd = g->wd, plane = h * wd;
    int32_t orow[48], ocol[48];
    for (int64_t lane = 0; lane < 48; ++lane) { /* lanes past the strip repeat its first position, masked */
        const int64_t t = t0 + (lane < w ? lane : 0);
        orow[lane] = (int32_t)((t / g->wo) * g->sh);
        ocol[lane] = (int32_t)((t % g->wo) * g->sw);
    }
    const int nv = w > 32 ? 3 : 2;
    __m512i base[3], ir[3], ic[3];
    __mmask16 live[3];
    for (int v = 0; v < 3; ++v) {
        ir[v] = _mm512_loadu_si512(orow + 16 * v);
        ic[v] = _mm512_loadu_si512(ocol + 16 * v);
        base[v] = _mm512_add_epi32(_mm512_mullo_epi32(ir[v], _mm512_set1_epi32((int)wd)), ic[v]);
        live[v] = sg_mask(w - 16 * v);
    }
    for (int64_t i = 0; i < g->kh; ++i)
        for (int64_t j = 0; j < g->kw; ++j) {
            const int32_t ro = (int32_t)(i * g->dh - g->pt), co = (int32_t)(j * g->dw - g->pl);
            const __m512i vro = _mm512_set1_epi32(ro), vco = _mm512_set1_epi32(co);
            const __m512i off = _mm512_set1_epi32((int32_t)(ro * wd + co));
            __mmask16 in[3];
            __m512i idx[3];
            for (int v = 0; v < nv; ++v) {
                const __m512i r = _mm512_add_epi32(ir[v], vro), q = _mm512_add_epi32(ic[v], vco);
                in[v] = live[v] & _mm512_cmpge_epi32_mask(r, _mm512_setzero_si512()) &
                        _mm512_cmplt_epi32_mask(r, _mm512_set1_epi32((int)h)) &
                        _mm512_cmpge_epi32_mask(q, _mm512_setzero_si512()) &
                        _mm512_cmplt_epi32_mask(q, _mm512_set1_epi32((int)wd));
                idx[v] = _mm512_add_epi32(base[v], off);
            }
            const int64_t tap = i * g->kw + j;
            for (int64_t ci = 0; ci < g->cg; ++ci) {
                const float *xc = g->x + ci * plane;
                float *row = panel + (ci * taps + tap) * 48;
                for (int v = 0; v < nv; ++v)
                    _mm512_storeu_ps(row + 16 * v,
                                     _mm512_mask_i32gather_ps(_mm512_setzero_ps(), in[v], idx[v], xc, 4));
            }
        }
    /* the strip's tiles over the panel (ldb 48): sg_strip_rows reads columns [t0, t0 + w) of b = panel - t0 */
    sg_strip_rows(g->a, panel - t0, g->c, i0, i1, t0, g->l, k, k, 48, g->l, g->bias, g->epi);
}

static int conv_gather_one(const float *x, const float *w, const float *bias, float *out, int64_t og, int64_t cg,
                           int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                           int64_t dw, int64_t pt, int64_t pl, int64_t ho, int64_t wo, int nthreads,
                           const sg_epi *epi) {
    const int64_t l = ho * wo, k = cg * kh * kw, macs = og * l * k;
    const int nt = sg_threads(macs, nthreads);
    const int64_t strips = sg_strips(l);
    /* whole strips per task, or with fewer strips than threads, strips cut into row blocks of 24 (each
       gathering its own panel) */
    const int64_t rows = nt > 1 && strips < nt ? 24 : og;
    gs_job g = {w,    x,  bias, out, og, l,    cg,   h, wd, kh, kw, sh, sw, dh, dw, pt, pl, wo,
                rows, (og + rows - 1) / rows, epi && epi->kind ? epi : NULL, 0};
    pool_run(gs_task, &g, strips * g.blocks, nt);
    return atomic_load(&g.failed) ? -1 : 0;
}

/* ---------------------------------------------------------------------------------------------------
   Narrow products with the output rows in vector lanes (a network's last stages: 4x4, 3x3, 2x2 images,
   where the strips would be mostly empty lanes): c = bias + a @ b for n <= 16 columns, a packed once by
   the caller as blocks of 16 rows, each (k, 16) (opstrata.ops.native.kernels._lanes_weights; rows past m
   zero). Per block group, every column's accumulator is a vector of 16 rows: one weight vector per block
   and step of k (the weights stream once, in order) times a broadcast of b's entry. Each output is the
   strips' chain -- its bias, then fma(a, b, acc) over k in order -- so the same bits as a wide product's.
   ------------------------------------------------------------------------------------------------- */
#define SL_MAX_N 16
typedef struct {
    const float *ap, *b, *bias;
    float *c;
    int64_t m, n, k, ldb, ldc;
    const sg_epi *epi;
} sl_job;

/* blocks [blk, blk + NO) of 16 rows (the last may be partial) against the N columns */
#define SL_BLOCKS(N, NO)                                                                                    \
    static void sl_blocks_##N##_##NO(const sl_job *g, int64_t blk) {                                        \
        const int64_t k = g->k, r0 = blk * 16;                                                              \
        const float *w = g->ap + blk * k * 16, *b = g->b;                                                   \
        __m512 acc[NO][N];                                                                                  \
        for (int o = 0; o < NO; ++o) {                                                                      \
            const __mmask16 bm = sg_mask(g->m - r0 - 16 * o);                                               \
            const __m512 init = g->bias ? _mm512_maskz_loadu_ps(bm, g->bias + r0 + 16 * o) : _mm512_setzero_ps(); \
            for (int j = 0; j < N; ++j) acc[o][j] = init;                                                   \
        }                                                                                                   \
        for (int64_t p = 0; p < k; ++p) {                                                                   \
            __m512 wv[NO];                                                                                  \
            for (int o = 0; o < NO; ++o) {                                                                  \
                wv[o] = _mm512_loadu_ps(w + (o * k + p) * 16);                                              \
                _mm_prefetch((const char *)(w + (o * k + p) * 16 + 1024), _MM_HINT_T0);                     \
            }                                                                                               \
            const float *bp = b + p * g->ldb;                                                               \
            for (int j = 0; j < N; ++j) {                                                                   \
                const __m512 bj = _mm512_set1_ps(bp[j]);                                                    \
                for (int o = 0; o < NO; ++o) acc[o][j] = _mm512_fmadd_ps(wv[o], bj, acc[o][j]);             \
            }                                                                                               \
        }                                                                                                   \
        for (int o = 0; o < NO; ++o) { /* rows in lanes -> rows of c: through a 16 x N tile on the stack */ \
            float tile[N][16];                                                                              \
            for (int j = 0; j < N; ++j) _mm512_storeu_ps(tile[j], acc[o][j]);                               \
            const int64_t rows = g->m - r0 - 16 * o < 16 ? g->m - r0 - 16 * o : 16;                         \
            for (int64_t r = 0; r < rows; ++r) {                                                            \
                float *cr = g->c + (r0 + 16 * o + r) * g->ldc;                                              \
                for (int j = 0; j < N; ++j) cr[j] = tile[j][r];                                             \
            }                                                                                               \
        }                                                                                                   \
    }
/* NO blocks per group: enough accumulators (NO * N) to hide the multiply-add latency, at most 22 */
#define SL_N(N, NO)                                                                                         \
    SL_BLOCKS(N, NO)                                                                                        \
    SL_BLOCKS(N, 1)                                                                                         \
    static void sl_rows_##N(const sl_job *g, int64_t blk0, int64_t blk1) {                                  \
        int64_t blk = blk0;                                                                                 \
        for (; blk + NO <= blk1; blk += NO) sl_blocks_##N##_##NO(g, blk);                                   \
        for (; blk < blk1; ++blk) sl_blocks_##N##_1(g, blk);                                                \
    }
/* N >= 12: one block per group (12-16 accumulators) */
SL_BLOCKS(16, 1)
SL_BLOCKS(15, 1)
SL_BLOCKS(14, 1)
SL_BLOCKS(13, 1)
SL_BLOCKS(12, 1)
#define SL_N1(N)                                                                                            \
    static void sl_rows_##N(const sl_job *g, int64_t blk0, int64_t blk1) {                                  \
        for (int64_t blk = blk0; blk < blk1; ++blk) sl_blocks_##N##_1(g, blk);                              \
    }
SL_N1(16)
SL_N1(15)
SL_N1(14)
SL_N1(13)
SL_N1(12)
SL_N(11, 2)
SL_N(10, 2)
SL_N(9, 2)
SL_N(8, 2)
SL_N(7, 3)
SL_N(6, 3)
SL_N(5, 4)
SL_N(4, 4)
SL_N(3, 6)
SL_N(2, 8)
SL_N(1, 8)
#undef SL_N
#undef SL_N1
#undef SL_BLOCKS

typedef void (*sl_rows_fn)(const sl_job *g, int64_t blk0, int64_t blk1);
static const sl_rows_fn SL_ROWS[SL_MAX_N + 1] = {
    NULL, sl_rows_1, sl_rows_2, sl_rows_3, sl_rows_4, sl_rows_5, sl_rows_6, sl_rows_7, sl_rows_8,
    sl_rows_9, sl_rows_10, sl_rows_11, sl_rows_12, sl_rows_13, sl_rows_14, sl_rows_15, sl_rows_16,
};
#define SL_TASK_BLOCKS 2 /* blocks of 16 rows per task: 32 rows, the weights of a task stream together */

static void sl_task(void *ctx, int64_t t) {
    const sl_job *g = (const sl_job *)ctx;
    const int64_t blocks = (g->m + 15) / 16, b0 = t * SL_TASK_BLOCKS;
    const int64_t b1 = b0 + SL_TASK_BLOCKS < blocks ? b0 + SL_TASK_BLOCKS : blocks;
    SL_ROWS[g->n](g, b0, b1);
    if (g->epi) /* the rows are complete and cache-hot: n <= 16 columns, one masked vector each */
        for (int64_t r = b0 * 16; r < b1 * 16 && r < g->m; ++r) {
            float *cr = g->c + r * g->ldc;
            const __mmask16 msk = sg_mask(g->n);
            _mm512_mask_storeu_ps(cr, msk, sg_epi_apply(_mm512_maskz_loadu_ps(msk, cr), (int)g->epi->kind, g->epi, cr, msk));
        }
}

static void sgemm_lanes_one(const float *ap, const float *b, float *c, int64_t m, int64_t n, int64_t k, int64_t ldb,
                            int64_t ldc, const float *bias, int nthreads, const sg_epi *epi) {
    const int64_t macs = m * n * k, tasks = ((m + 15) / 16 + SL_TASK_BLOCKS - 1) / SL_TASK_BLOCKS;
    const int nt = sg_threads(macs, nthreads);
    const sl_job g = {ap, b, bias, c, m, n, k, ldb, ldc, epi && epi->kind ? epi : NULL};
    pool_run(sl_task, (void *)&g, tasks, nt);
}

/* A linear layer's product x @ W^T over its weight packed once (W (n, k), as Linear / Gemm(transB) store it):
   W^T cut into the strip GEMM's strips (sg_strips), strip s a (k, width) panel of its own at wp + 32 * s * k,
   so that each strip's rows stream contiguously (read in place, rows of W^T lie n floats apart, and a
   power-of-two n maps them onto the same cache sets: 64x512x2048 ran 2.3x slower). The strip tiles, rows of
   x broadcast; each output the in-order multiply-add chain over k from 0 (the caller adds the bias). */
typedef struct {
    const float *x, *wp;
    float *c;
    int64_t m, n, k, lda, ldc, rows, blocks; /* rows per task; row blocks per strip */
} lp_job;

static void lp_task(void *ctx, int64_t t) {
    const lp_job *g = (const lp_job *)ctx;
    const int64_t s = t / g->blocks, i0 = (t % g->blocks) * g->rows;
    const int64_t i1 = i0 + g->rows < g->m ? i0 + g->rows : g->m, w = sg_strip_width(g->n, s);
    sg_strip_rows(g->x, g->wp + 32 * s * g->k, g->c + 32 * s, i0, i1, 0, w, g->k, g->lda, w, g->ldc, NULL, NULL);
}

static void linear_packed_one(const float *x, const float *wp, float *c, int64_t m, int64_t n, int64_t k,
                              int64_t lda, int64_t ldc, int nthreads) {
    const int nt = sg_threads(m * n * k, nthreads);
    const int64_t strips = sg_strips(n);
    lp_job g = {x, wp, c, m, n, k, lda, ldc, m, 1};
    if (nt > 1 && strips < 4 * nt) { /* too few strips to share: cut them into row blocks of 24 */
        g.rows = 24;
        g.blocks = (m + 23) / 24;
    }
    pool_run(lp_task, &g, strips * g.blocks, nt);
}

/* Depthwise convolution with 16 channels in the lanes of a vector, for planes narrower than a vector (a
   network's 8x8 .. 1x1 stages, where a row fills part of a vector and a plane's scratch costs more than
   its taps): per (image, block of 16 channels), the block's pixels are gathered into a zero-padded
   pixel-major scratch and its taps into one vector each, then every output is the bias plus its kh * kw
   taps in row-major order (one FMA each, as the plane loop contracts them), the epilogue (kinds 1-3) and
   one masked scatter back to the NCHW planes. Channels past c are masked off. */
typedef struct {
    const float *x, *w, *bias;
    float *out;
    int64_t n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo;
    const sg_epi *epi;
} dwl_args;

static int depthwise_lanes16(const void *args, int64_t i0, int64_t i1) {
    const dwl_args *g = (const dwl_args *)args;
    const int64_t c = g->c, h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw;
    const int64_t dh = g->dh, dw = g->dw, pt = g->pt, pl = g->pl, ho = g->ho, wo = g->wo;
    const int64_t pix = h * wd, opix = ho * wo, taps = kh * kw, blocks = (c + 15) / 16;
    const int64_t hp = (ho - 1) * sh + (kh - 1) * dh + 1, wp = (wo - 1) * sw + (kw - 1) * dw + 1;
    const int kind = g->epi ? (int)g->epi->kind : 0;
    float *xt = (float *)aligned_alloc(64, (size_t)((hp * wp + taps) * 16) * sizeof(float));
    if (!xt) return -1;
    float *wt = xt + hp * wp * 16;
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i ix = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)pix));
    const __m512i iw = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)taps));
    const __m512i io = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)opix));
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t item = i0; item < i1; ++item) {
        const int64_t img = item / blocks, c0 = (item % blocks) * 16;
        const __mmask16 m = (__mmask16)(c - c0 >= 16 ? 0xFFFF : (1u << (c - c0)) - 1);
        const float *xc = g->x + (img * c + c0) * pix;
        for (int64_t r = 0; r < hp; ++r) {
            const int64_t ih = r - pt;
            for (int64_t q = 0; q < wp; ++q) {
                const int64_t iq = q - pl;
                __m512 v = zero;
                if (ih >= 0 && ih < h && iq >= 0 && iq < wd)
                    v = _mm512_mask_i32gather_ps(zero, m, ix, xc + ih * wd + iq, 4);
                _mm512_store_ps(xt + (r * wp + q) * 16, v);
            }
        }
        for (int64_t t = 0; t < taps; ++t)
            _mm512_store_ps(wt + t * 16, _mm512_mask_i32gather_ps(zero, m, iw, g->w + c0 * taps + t, 4));
        const __m512 b0 = g->bias ? _mm512_maskz_loadu_ps(m, g->bias + c0) : zero;
        float *oc = g->out + (img * c + c0) * opix;
        for (int64_t oh = 0; oh < ho; ++oh) {
            for (int64_t ow = 0; ow < wo; ++ow) {
                __m512 acc = b0;
                for (int64_t i = 0; i < kh; ++i) {
                    const float *row = xt + ((oh * sh + i * dh) * wp + ow * sw) * 16;
                    const float *wr = wt + i * kw * 16;
                    for (int64_t j = 0; j < kw; ++j)
                        acc = _mm512_fmadd_ps(_mm512_load_ps(wr + j * 16), _mm512_load_ps(row + j * dw * 16), acc);
                }
                if (kind) acc = sg_epi_apply(acc, kind, g->epi, NULL, m);
                _mm512_mask_i32scatter_ps(oc + oh * wo + ow, m, io, acc, 4);
            }
        }
    }
    free(xt);
    return 0;
}

int opstrata_sgemm_fma_fast(void) { return 1; }
#else
static inline float max_nan_f32(float a, float b);
static inline float min_nan_f32(float a, float b);
/* the epilogue on one value, as sg_epi_apply; the rounded product and sum kept apart by fp-contract=off */
__attribute__((optimize("fp-contract=off"))) static float sg_epi_scalar(float h, const sg_epi *e) {
    switch (e->kind) {
    case 1:
        return relu_f32(h);
    case 2:
        return min_nan_f32(max_nan_f32(h, e->c0), e->c1);
    case 3: {
        float t = h * e->c0;
        t = t + e->c1;
        return min_nan_f32(max_nan_f32(t, e->c2), e->c3) * h;
    }
    default:
        return h;
    }
}
static int sgemm_fma_one(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k, int64_t lda,
                         int64_t ldb, int64_t ldc, const float *bias, int nthreads, const sg_epi *epi) {
    (void)nthreads;
    for (int64_t i = 0; i < m; ++i) {
        float *ci = c + i * ldc;
        const float init = bias ? bias[i] : 0.0f;
        for (int64_t j = 0; j < n; ++j) ci[j] = init;
        for (int64_t p = 0; p < k; ++p) {
            const float av = a[i * lda + p];
            const float *bp = b + p * ldb;
            for (int64_t j = 0; j < n; ++j) ci[j] = fmaf(av, bp[j], ci[j]);
        }
        if (epi && (epi->kind == 4 || epi->kind == 5)) /* the residual's add, then ReLU for kind 5 */
            for (int64_t j = 0; j < n; ++j) {
                const float r = ci[j] + ci[j + epi->rdelta];
                ci[j] = epi->kind == 5 ? relu_f32(r) : r;
            }
        else if (epi && epi->kind)
            for (int64_t j = 0; j < n; ++j) ci[j] = sg_epi_scalar(ci[j], epi);
    }
    return 0;
}
int opstrata_sgemm_fma_fast(void) { return 0; }
#endif

/* The channels-in-lanes depthwise convolution (depthwise_lanes16) with epilogue kinds 1-3 applied as each
   output is stored; without AVX-512, the plane / channel-block loops and then the epilogue on each value.
   Returns 0, -1 out of memory, -3 a bad kind, -4 offsets past 32 bits. */
int opstrata_depthwise_lanes_f32(const float *x, const float *w, const float *bias, float *out, int64_t n,
                                 int64_t c, int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                 int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho, int64_t wo,
                                 int64_t nthreads, int64_t act, const float *params) {
    sg_epi e;
    if (act > 3 || sg_epi_from(act, params, NULL, out, &e)) return -3;
#if defined(__AVX512F__)
    /* gather / scatter offsets are lane * (plane, taps, output plane) in 32 bits */
    const int64_t widest = h * wd > ho * wo ? (h * wd > kh * kw ? h * wd : kh * kw) : (ho * wo > kh * kw ? ho * wo : kh * kw);
    if (16 * widest > INT32_MAX) return -4;
    const dwl_args g = {x, w, bias, out, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, act ? &e : NULL};
    return run_ranges(depthwise_lanes16, &g, n * ((c + 15) / 16), 16 * kh * kw * ho * wo, nthreads);
#else
    const int rc =
        opstrata_depthwise_conv2d_f32(x, w, bias, out, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, nthreads);
    if (rc || !act) return rc;
    for (int64_t i = 0; i < n * c * ho * wo; ++i) out[i] = sg_epi_scalar(out[i], &e);
    return 0;
#endif
}

/* c = epilogue(bias + a @ b) per batch item; act / params / res: sg_epi's kind, c0..c3 (kinds 2, 3) and the
   residual laid out as c (kinds 4, 5); unused ones may be NULL. Returns 0, -1 out of memory, -3 a bad kind. */
int opstrata_sgemm_fma_epi_f32(const float *a, const float *b, float *c, const float *bias, int64_t m, int64_t n,
                               int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa,
                               int64_t sb, int64_t sc, int64_t sbias, int64_t nthreads, int64_t act,
                               const float *params, const float *res) {
    sg_epi e;
    if (sg_epi_from(act, params, res, c, &e)) return -3;
    for (int64_t t = 0; t < batch; ++t)
        if (sgemm_fma_one(a + t * sa, b + t * sb, c + t * sc, m, n, k, lda, ldb, ldc, bias ? bias + t * sbias : NULL,
                          (int)nthreads, act ? &e : NULL))
            return -1;
    return 0;
}
/* out = epilogue(bias + conv(x, w)) of any 2-D convolution (strided ones and others whose output rows are
   not the input's width), its columns gathered strip by strip (see gs_task); w (o, c / groups, kh, kw) as it
   lies, n images, `groups` groups; act / params / res as opstrata_sgemm_fma_epi_f32. Returns 0; -1 when a
   panel cannot be allocated; -2 without the AVX-512 tiles; -3 bad arguments. */
int opstrata_conv_gather_f32(const float *x, const float *w, const float *bias, float *out, int64_t n, int64_t c,
                             int64_t h, int64_t wd, int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t sh,
                             int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t ho, int64_t wo,
                             int64_t nthreads, int64_t act, const float *params, const float *res) {
#if defined(__AVX512F__)
    if (kh < 1 || kw < 1 || groups < 1 || c % groups || o % groups || ho < 1 || wo < 1) return -3;
    if (h * wd > INT32_MAX / 2 || (ho * sh + kh * dh) * wd > INT32_MAX / 2) return -3; /* 32-bit gather offsets */
    sg_epi e;
    if (sg_epi_from(act, params, res, out, &e)) return -3;
    const int64_t cg = c / groups, og = o / groups, l = ho * wo, k = cg * kh * kw;
    for (int64_t img = 0; img < n; ++img)
        for (int64_t grp = 0; grp < groups; ++grp)
            if (conv_gather_one(x + (img * c + grp * cg) * h * wd, w + grp * og * k, bias ? bias + grp * og : NULL,
                                out + (img * o + grp * og) * l, og, cg, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo,
                                (int)nthreads, act ? &e : NULL))
                return -1;
    return 0;
#else
    (void)x, (void)w, (void)bias, (void)out, (void)n, (void)c, (void)h, (void)wd, (void)o, (void)groups, (void)kh;
    (void)kw, (void)sh, (void)sw, (void)dh, (void)dw, (void)pt, (void)pl, (void)ho, (void)wo, (void)nthreads;
    (void)act, (void)params, (void)res;
    return -2;
#endif
}

/* c = epilogue(bias + a @ b) per batch item for n <= 16 columns, a packed as blocks of 16 rows (see
   sgemm_lanes_one; sa: floats per batch item's packed a); the arguments otherwise those of
   opstrata_sgemm_fma_epi_f32 (lda unused). Returns 0; -2 without the AVX-512 tiles; -3 bad arguments. */
int opstrata_sgemm_lanes_f32(const float *ap, const float *b, float *c, const float *bias, int64_t m, int64_t n,
                             int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                             int64_t sc, int64_t sbias, int64_t nthreads, int64_t act, const float *params,
                             const float *res) {
    (void)lda;
#if defined(__AVX512F__)
    if (n < 1 || n > SL_MAX_N) return -3;
    sg_epi e;
    if (sg_epi_from(act, params, res, c, &e)) return -3;
    for (int64_t t = 0; t < batch; ++t)
        sgemm_lanes_one(ap + t * sa, b + t * sb, c + t * sc, m, n, k, ldb, ldc, bias ? bias + t * sbias : NULL,
                        (int)nthreads, act ? &e : NULL);
    return 0;
#else
    (void)ap, (void)b, (void)c, (void)bias, (void)m, (void)n, (void)k, (void)ldb, (void)ldc, (void)batch, (void)sa;
    (void)sb, (void)sc, (void)sbias, (void)nthreads, (void)act, (void)params, (void)res;
    return -2;
#endif
}
/* c (m, n) = x (m, k) @ W^T for W packed by the caller into strip panels (see linear_packed_one; the
   layout is ops.native.kernels._linear_weights'); lda / ldc the row strides of x and c. Returns 0, or -2
   without the AVX-512 tiles (the caller keeps the BLAS). */
int opstrata_linear_packed_f32(const float *x, const float *wp, float *c, int64_t m, int64_t n, int64_t k,
                               int64_t lda, int64_t ldc, int64_t nthreads) {
#if defined(__AVX512F__)
    if (m < 1 || n < 1 || k < 1) return -3;
    linear_packed_one(x, wp, c, m, n, k, lda, ldc, (int)nthreads);
    return 0;
#else
    (void)x, (void)wp, (void)c, (void)m, (void)n, (void)k, (void)lda, (void)ldc, (void)nthreads;
    return -2;
#endif
}
int opstrata_sgemm_fma_f32(const float *a, const float *b, float *c, const float *bias, int64_t m, int64_t n,
                           int64_t k, int64_t lda, int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb,
                           int64_t sc, int64_t sbias, int64_t nthreads) {
    return opstrata_sgemm_fma_epi_f32(a, b, c, bias, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, sbias, nthreads, 0,
                                      NULL, NULL);
}

/* out = epilogue(bias + conv(x, w)) of a stride-1 convolution whose output rows are as wide as the input's
   (the direct tiles above; dilation and any padding that keeps the width), over n images and `groups` groups;
   wp: the weights packed in panels (see the tiles), group after group -- packed once by the caller;
   act / params / res as opstrata_sgemm_fma_epi_f32. Returns 0; -2 without the AVX-512 tiles (the caller keeps
   im2col + GEMM); -3 bad arguments (epilogue kind, more than DC_MAX_TAPS taps, groups not dividing c and o). */
int opstrata_conv_direct_f32(const float *x, const float *wp, const float *bias, float *out, int64_t n, int64_t c,
                             int64_t h, int64_t wd, int64_t o, int64_t groups, int64_t kh, int64_t kw, int64_t dh,
                             int64_t dw, int64_t pt, int64_t pl, int64_t ho, int64_t nthreads, int64_t act,
                             const float *params, const float *res) {
#if defined(__AVX512F__)
    if (kh * kw > DC_MAX_TAPS || kh < 1 || kw < 1 || groups < 1 || c % groups || o % groups) return -3;
    sg_epi e;
    if (sg_epi_from(act, params, res, out, &e)) return -3;
    const int64_t cg = c / groups, og = o / groups, l = ho * wd, k = cg * kh * kw;
    for (int64_t img = 0; img < n; ++img)
        for (int64_t grp = 0; grp < groups; ++grp)
            conv_direct_one(x + (img * c + grp * cg) * h * wd, wp + grp * og * k, bias ? bias + grp * og : NULL,
                            out + (img * o + grp * og) * l, og, cg, h, wd, kh, kw, dh, dw, pt, pl, ho,
                            (int)nthreads, act ? &e : NULL);
    return 0;
#else
    (void)x, (void)wp, (void)bias, (void)out, (void)n, (void)c, (void)h, (void)wd, (void)o, (void)groups;
    (void)kh, (void)kw, (void)dh, (void)dw, (void)pt, (void)pl, (void)ho, (void)nthreads, (void)act;
    (void)params, (void)res;
    return -2;
#endif
}

/* 2-D max pooling of NCHW float32 planes, padding never chosen (the max over the window's in-image taps,
   as ONNX MaxPool and torch): out (n, c, ho, wo); a NaN tap wins, as np.maximum. ho / wo come from the
   caller (floor or ceil mode). Separable, in long vectorized passes over each plane: a plane with padding
   (or ceil mode's overhang) is first copied into a -inf border, so every window lies inside it; q holds,
   for every start row, the max over the window's kh rows (the plane read as one flat array), and r, for
   every flat start position of q, the max over kw taps to its right; each output picks its value from r
   (a window with no in-image tap gives -inf). NaN-free input (checked in one pass) takes the plain max, one
   vector instruction. Returns 0, or -1 when the buffers cannot be allocated. */
static inline float max_nan_f32(float a, float b) { return a != a ? a : (a >= b ? a : b); }
/* the same choice (a NaN in either wins), written without branches so that the compiler vectorizes it */
static inline float max_nan_sel_f32(float a, float b) { return ((b > a) | (b != b)) ? b : a; }
static inline float plain_max_f32(float a, float b) { return b > a ? b : a; }

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 14
#define NO_VECTORIZE _Pragma("GCC novector")
#else
#define NO_VECTORIZE
#endif

/* dst[t] = max over k taps src[t + i * step] (k >= 1), at most three taps per pass over dst; one tight
   loop per pass (out of line: inlined into the plane loop, its pointers spill) */
#define POOL_TAPS(NAME, MAX2)                                                                                 \
    static __attribute__((noinline)) void NAME(float *restrict dst, const float *restrict src, int64_t len,  \
                                               int64_t k, int64_t step) {                                     \
        if (k == 1) {                                                                                         \
            memcpy(dst, src, (size_t)len * sizeof(float));                                                    \
            return;                                                                                           \
        }                                                                                                     \
        const float *restrict s1 = src + step;                                                                \
        if (k == 2) {                                                                                         \
            for (int64_t t = 0; t < len; ++t) dst[t] = MAX2(src[t], s1[t]);                                   \
            return;                                                                                           \
        }                                                                                                     \
        const float *restrict s2 = src + 2 * step;                                                            \
        for (int64_t t = 0; t < len; ++t) dst[t] = MAX2(MAX2(src[t], s1[t]), s2[t]);                          \
        for (int64_t i = 3; i < k; ++i) {                                                                     \
            const float *restrict si = src + i * step;                                                        \
            for (int64_t t = 0; t < len; ++t) dst[t] = MAX2(dst[t], si[t]);                                   \
        }                                                                                                     \
    }
POOL_TAPS(pool_taps_plain, plain_max_f32)
POOL_TAPS(pool_taps_nan, max_nan_sel_f32)
#undef POOL_TAPS

static int any_nan_f32(const float *x, int64_t n) {
    int any = 0;
    for (int64_t t = 0; t < n; ++t) any |= x[t] != x[t];
    return any;
}

#if defined(__AVX512F__)
/* Max pooling with horizontal stride 2 (the pools of ResNet, SqueezeNet, MobileNet), kw <= 16, in registers:
   per 16 outputs of a row, the max over the window's in-image rows of the 48 input columns they read (three
   vectors, -inf outside the image), then each of the kw taps as the stride-2 lanes of those vectors (a
   two-source permute, lanes past 32 columns from the third). The same taps in the same order and the same
   choice per pair as the separable passes below (b wins when b > a or b is NaN; -inf taps change nothing),
   so the same bits, without the passes' stride-1 work or their NaN check. */
static inline __m512 pool_sel(__m512 a, __m512 b) {
    const __mmask16 take = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(take, a, b);
}
/* lanes l of 16 with 0 <= c0 + l < wd */
static inline __mmask16 cols_in(int64_t c0, int64_t wd) {
    const int64_t lo = c0 < 0 ? -c0 : 0, hi = wd - c0 < 16 ? wd - c0 : 16;
    if (hi <= lo) return 0;
    return (__mmask16)((((uint32_t)1 << hi) - 1u) & ~(((uint32_t)1 << lo) - 1u));
}
/* one plane; SEL is the choice between a and b (pool_sel, or where the plane holds no NaN the one-instruction
   max with the same choice: max_ps(b, a) = b > a ? b : a); returns whether a loaded tap may have been NaN */
#define POOL_S2_PLANE(NAME, SEL)                                                                            \
    static int NAME(const window_args *g, const float *plane, float *op) {                                  \
        const int64_t h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, sh = g->sh, dh = g->dh;                 \
        const int64_t pt = g->pt, pl = g->pl, ho = g->ho, wo = g->wo;                                       \
        const __m512 ninf = _mm512_set1_ps(-INFINITY);                                                      \
        const __m512i lane2 = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);  \
        /* the window's taps summed: NaN when one is NaN (or where infs or an overflow make it NaN: then the \
           plane is redone too, to the same result) */                                                      \
        __mmask16 nan = 0;                                                                                  \
        for (int64_t ow = 0; ow < wo; ow += 16) {                                                           \
            const int64_t c0 = 2 * ow - pl; /* the first input column these 16 outputs read */              \
            const __mmask16 m0 = cols_in(c0, wd), m1 = cols_in(c0 + 16, wd), m2 = cols_in(c0 + 32, wd);     \
            const __mmask16 sm = wo - ow >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (wo - ow)) - 1u);   \
            for (int64_t oh = 0; oh < ho; ++oh) {                                                           \
                /* the window's in-image rows i in [i0, i1) (rows outside are -inf: they change no max) */  \
                const int64_t r0 = oh * sh - pt;                                                            \
                int64_t i0 = r0 < 0 ? (-r0 + dh - 1) / dh : 0, i1 = (h - r0 + dh - 1) / dh;                 \
                if (i1 > kh) i1 = kh;                                                                       \
                __m512 v0 = ninf, v1 = ninf, v2 = ninf;                                                     \
                if (i0 < i1) {                                                                              \
                    const float *src = plane + (r0 + i0 * dh) * wd + c0;                                    \
                    v0 = _mm512_mask_loadu_ps(ninf, m0, src);                                               \
                    v1 = _mm512_mask_loadu_ps(ninf, m1, src + 16);                                          \
                    v2 = _mm512_mask_loadu_ps(ninf, m2, src + 32);                                          \
                    __m512 sum = _mm512_add_ps(_mm512_add_ps(v0, v1), v2);                                  \
                    for (int64_t i = i0 + 1; i < i1; ++i) {                                                 \
                        src += dh * wd;                                                                     \
                        const __m512 t0 = _mm512_mask_loadu_ps(ninf, m0, src);                              \
                        const __m512 t1 = _mm512_mask_loadu_ps(ninf, m1, src + 16);                         \
                        const __m512 t2 = _mm512_mask_loadu_ps(ninf, m2, src + 32);                         \
                        sum = _mm512_add_ps(sum, _mm512_add_ps(_mm512_add_ps(t0, t1), t2));                \
                        v0 = SEL(v0, t0);                                                                   \
                        v1 = SEL(v1, t1);                                                                   \
                        v2 = SEL(v2, t2);                                                                   \
                    }                                                                                       \
                    nan |= _mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q);                                      \
                }                                                                                           \
                /* tap j: lanes l read column 2 l + j of (v0, v1); those past 32 columns read v2 */         \
                __m512 out = _mm512_permutex2var_ps(v0, lane2, v1);                                         \
                for (int64_t j = 1; j < kw; ++j) {                                                          \
                    const __m512i idx = _mm512_add_epi32(lane2, _mm512_set1_epi32((int)j));                 \
                    const __mmask16 far = (__mmask16)(0xFFFFu << ((33 - j) / 2 < 16 ? (33 - j) / 2 : 16));  \
                    const __m512 tap = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(v0, idx, v1), far, idx, v2); \
                    out = SEL(out, tap);                                                                    \
                }                                                                                           \
                _mm512_mask_storeu_ps(op + oh * wo + ow, sm, out);                                          \
            }                                                                                               \
        }                                                                                                   \
        return nan != 0;                                                                                    \
    }
#define POOL_MAX_PS(a, b) _mm512_max_ps(b, a)
POOL_S2_PLANE(max_pool_plane_s2_plain, POOL_MAX_PS)
POOL_S2_PLANE(max_pool_plane_s2_nan, pool_sel)
#undef POOL_MAX_PS
#undef POOL_S2_PLANE

static void max_pool_planes_s2(const window_args *g, int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
        const float *plane = g->x + p * g->h * g->wd;
        float *op = g->out + p * g->ho * g->wo;
        if (max_pool_plane_s2_plain(g, plane, op)) max_pool_plane_s2_nan(g, plane, op); /* again, keeping NaN */
    }
}
#endif

/* planes [p0, p1) */
static int max_pool_planes(const void *args, int64_t p0, int64_t p1) {
    const window_args *g = (const window_args *)args;
#if defined(__AVX512F__)
    if (g->sw == 2 && g->dw == 1 && g->kw <= 16) {
        max_pool_planes_s2(g, p0, p1);
        return 0;
    }
#endif
    const int64_t h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw, dh = g->dh, dw = g->dw;
    const int64_t pt = g->pt, pl = g->pl, ho = g->ho, wo = g->wo;
    /* the padded plane: every window of every output inside it */
    const int64_t span_h = (ho - 1) * sh + (kh - 1) * dh + 1, span_w = (wo - 1) * sw + (kw - 1) * dw + 1;
    const int64_t hp = span_h > h + pt ? span_h : h + pt, wp = span_w > wd + pl ? span_w : wd + pl;
    const int pad = hp != h || wp != wd;
    const int64_t rows = hp - (kh - 1) * dh; /* start rows: every output row's window starts at one */
    const int64_t qlen = rows * wp, rlen = qlen - (kw - 1) * dw;
    float *buf = (float *)malloc((size_t)(qlen + rlen + (pad ? hp * wp : 0)) * sizeof(float));
    if (!buf) return -1;
    float *q = buf, *r = buf + qlen, *padded = pad ? r + rlen : NULL;
    if (pad)
        for (int64_t t = 0; t < hp * wp; ++t) padded[t] = -INFINITY;
    void (*taps)(float *restrict, const float *restrict, int64_t, int64_t, int64_t) =
        any_nan_f32(g->x + p0 * h * wd, (p1 - p0) * h * wd) ? pool_taps_nan : pool_taps_plain;
    for (int64_t p = p0; p < p1; ++p) {
        const float *plane = g->x + p * h * wd;
        if (pad) { /* the image into the -inf border (the border stays from plane to plane) */
            for (int64_t i = 0; i < h; ++i)
                memcpy(padded + (i + pt) * wp + pl, plane + i * wd, (size_t)wd * sizeof(float));
            plane = padded;
        }
        taps(q, plane, qlen, kh, dh * wp); /* the max over kh rows, the plane read as one flat row */
        taps(r, q, rlen, kw, dw);          /* then over kw columns */
        float *op = g->out + p * ho * wo;
        for (int64_t oh = 0; oh < ho; ++oh) {
            const float *rrow = r + oh * sh * wp;
            float *orow = op + oh * wo;
            if (sw == 1) {
                memcpy(orow, rrow, (size_t)wo * sizeof(float));
            } else {
                NO_VECTORIZE /* a strided pick: gcc's 2-lane gathers of it are slower than the scalar loop */
                for (int64_t ow = 0; ow < wo; ++ow) orow[ow] = rrow[ow * sw];
            }
        }
    }
    free(buf);
    return 0;
}

int opstrata_max_pool2d_f32(const float *restrict x, float *restrict out, int64_t n, int64_t c, int64_t h,
                            int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                            int64_t pt, int64_t pl, int64_t ho, int64_t wo, int64_t nthreads) {
    if (ho <= 0 || wo <= 0 || n * c <= 0) return 0;
    const window_args g = {x, out, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo};
    return run_ranges(max_pool_planes, &g, n * c, (kh + kw) * h * wd, nthreads);
}

/* average pooling without padding or dilation (DenseNet's transitions, AvgPool2d(k, s)): each window
   summed tap by tap in row-major order from its first tap, then divided by kh * kw -- numpy's kernel
   (one strided plane per tap added into the first) in the same float32 order: the same bits */
static int avg_pool_planes(const void *args, int64_t p0, int64_t p1) {
    const window_args *g = (const window_args *)args;
    const int64_t h = g->h, wd = g->wd, kh = g->kh, kw = g->kw, sh = g->sh, sw = g->sw, ho = g->ho, wo = g->wo;
    const float div = (float)(kh * kw);
    for (int64_t p = p0; p < p1; ++p) {
        const float *plane = g->x + p * h * wd;
        float *op = g->out + p * ho * wo;
        for (int64_t oh = 0; oh < ho; ++oh) {
            for (int64_t ow = 0; ow < wo; ++ow) {
                const float *w = plane + oh * sh * wd + ow * sw;
                float acc = w[0];
                for (int64_t j = 1; j < kw; ++j) acc += w[j];
                for (int64_t i = 1; i < kh; ++i)
                    for (int64_t j = 0; j < kw; ++j) acc += w[i * wd + j];
                op[oh * wo + ow] = acc / div;
            }
        }
    }
    return 0;
}

void opstrata_avg_pool2d_f32(const float *restrict x, float *restrict out, int64_t n, int64_t c, int64_t h,
                             int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ho, int64_t wo,
                             int64_t nthreads) {
    if (ho <= 0 || wo <= 0 || n * c <= 0) return;
    const window_args g = {x, out, h, wd, kh, kw, sh, sw, 1, 1, 0, 0, ho, wo};
    run_ranges(avg_pool_planes, &g, n * c, kh * kw * ho * wo, nthreads);
}

/* ---------------------------------------------------------------------------------------------------
   The elementwise VM: a FusedElementwise / codegen expression run as a short register program over
   cache-resident tiles, one C call per node (numexpr's design). The program is made by
   opstrata.ops.codegen.vm; an operation may write over its own operand (it reads index i before writing
   index i, so there is no restrict); every instruction is a vectorized loop over one tile of at most EW_TILE
   floats, so the switch that dispatches it costs nothing next to the work and the tile stays in L1.
   ------------------------------------------------------------------------------------------------- */

/* exp over the whole float range, IEEE limits kept: 2^n is built as two factors so that the result
   rounds into the denormals (down to x = -103.97) and overflows to inf above 88.72 as libm's expf. Below
   -104 the result is 0, computed at 0 meanwhile (no denormal product: see exp_f32). */
static inline float exp_full_f32(float x) {
    float xc = x > 89.0f ? 89.0f : (x < -104.0f ? 0.0f : x);
    float n = rintf(xc * 1.44269504088896341f);
    float p = exp_reduced(xc, n);
    int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
    int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, sizeof s1);
    memcpy(&s2, &b2, sizeof s2);
    float y = (p * s1) * s2;
    return x < -104.0f ? 0.0f : (x > 89.0f ? INFINITY : y);
}

/* tanh accurate in relative terms near 0 (Cephes' odd polynomial below 0.625), saturating form above */
static inline float tanh_acc_f32(float y) {
    float a = y < 0.0f ? -y : y;
    float z = y * y;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                    1.33314422036e-1f) * z - 3.33332819422e-1f) * z * y + y;
    float t = 1.0f - 2.0f / (exp_full_f32(2.0f * a) + 1.0f);
    float large = y < 0.0f ? -t : t;
    return a < 0.625f ? small : large;
}

static inline float sigmoid_full_f32(float h) { return 1.0f / (1.0f + exp_full_f32(-h)); }
static inline float silu_full_f32(float h) { return h / (1.0f + exp_full_f32(-h)); }
static inline float gelu_tanh_acc_f32(float h) {
    float inner = 0.7978845608028654f * (h + 0.044715f * h * h * h);
    return 0.5f * h * (1.0f + tanh_acc_f32(inner));
}
/* np.maximum / np.minimum: a NaN in either operand is the result */
static inline float min_nan_f32(float a, float b) { return a != a ? a : (a <= b ? a : b); }

#define EW_TILE 256
#define EW_MAX_REGS 64
#define EW_MAX_INPUTS 32

enum {
    EW_COPY, EW_ADD, EW_SUB, EW_MUL, EW_DIV, EW_POW, EW_MAX, EW_MIN, EW_LT, EW_LE, EW_GT, EW_GE, EW_EQ,
    EW_NE, EW_NEG, EW_ABS, EW_EXP, EW_LOG, EW_SQRT, EW_TANH, EW_RSQRT, EW_ERF, EW_SIGMOID, EW_RELU,
    EW_GELU, EW_GELU_TANH, EW_SILU, EW_WHERE, EW_N_OPS
};

#define EW_UN(EXPR)                                                                            \
    for (int64_t i = 0; i < n; ++i) {                                                          \
        float x = a[i];                                                                        \
        o[i] = (EXPR);                                                                         \
    }                                                                                          \
    break;
#define EW_BIN(EXPR)                                                                           \
    for (int64_t i = 0; i < n; ++i) {                                                          \
        float x = a[i], y = b[i];                                                              \
        o[i] = (EXPR);                                                                         \
    }                                                                                          \
    break;

static void ew_step(int op, float *o, const float *a, const float *b, const float *c, int64_t n) {
    switch (op) {
    case EW_COPY: EW_UN(x)
    case EW_ADD: EW_BIN(x + y)
    case EW_SUB: EW_BIN(x - y)
    case EW_MUL: EW_BIN(x * y)
    case EW_DIV: EW_BIN(x / y)
    case EW_POW: EW_BIN(powf(x, y))
    case EW_MAX: EW_BIN(max_nan_f32(x, y))
    case EW_MIN: EW_BIN(min_nan_f32(x, y))
    case EW_LT: EW_BIN(x < y ? 1.0f : 0.0f)
    case EW_LE: EW_BIN(x <= y ? 1.0f : 0.0f)
    case EW_GT: EW_BIN(x > y ? 1.0f : 0.0f)
    case EW_GE: EW_BIN(x >= y ? 1.0f : 0.0f)
    case EW_EQ: EW_BIN(x == y ? 1.0f : 0.0f)
    case EW_NE: EW_BIN(x != y ? 1.0f : 0.0f)
    case EW_NEG: EW_UN(-x)
    case EW_ABS: EW_UN(fabsf(x))
    case EW_EXP: EW_UN(exp_full_f32(x))
    case EW_LOG: EW_UN(logf(x))
    case EW_SQRT: EW_UN(sqrtf(x))
    case EW_TANH: EW_UN(tanh_acc_f32(x))
    case EW_RSQRT: EW_UN(1.0f / sqrtf(x))
    case EW_ERF: EW_UN(erf_f32(x))
    case EW_SIGMOID: EW_UN(sigmoid_full_f32(x))
    case EW_RELU: EW_UN(relu_f32(x))
    case EW_GELU: EW_UN(gelu_f32(x))
    case EW_GELU_TANH: EW_UN(gelu_tanh_acc_f32(x))
    case EW_SILU: EW_UN(silu_full_f32(x))
    case EW_WHERE:
        for (int64_t i = 0; i < n; ++i) o[i] = a[i] != 0.0f ? b[i] : c[i];
        break;
    }
}

/* Run a register program over an iteration space of up to EW_MAX_RDIMS row dimensions and one column
   dimension (numpy's broadcasting, dims coalesced by the caller).
   prog: n_instr x 5 int32 (op, dst, a, b, c); operand r >= 0 is register r, -1 - k is input k.
   Registers [0, n_const) hold consts[] splatted (filled once per call).
   Row index (i0, .., i3) over rdims[4] (row-major, rows = their product); input k's row starts at
   ins[k] + sum_d i_d * in_rs[k * 4 + d] and its column stride in_cs[k] is 0 (one value per row) or 1.
   The last instruction's register is written to out + row * out_rs + col as float32, or as bool bytes
   when out_bool. Returns 0, -1 for a bad program (unknown op, operand out of range), -2 out of memory. */
#define EW_MAX_RDIMS 4
/* every full input and the output lie densely across rows: row r starts r * cols after row 0 */
static int ew_dense_rows(const int64_t *in_rs, const int64_t *in_cs, int64_t n_in, int64_t out_rs,
                         const int64_t *rdims, int64_t cols) {
    if (out_rs != cols) return 0;
    for (int64_t k = 0; k < n_in; ++k) {
        if (!in_cs[k]) continue;
        int64_t step = cols; /* the stride a dense row-major layout gives dimension d */
        for (int d = EW_MAX_RDIMS - 1; d >= 0; --d) {
            if (rdims[d] > 1 && in_rs[k * EW_MAX_RDIMS + d] != step) return 0;
            step *= rdims[d];
        }
    }
    return 1;
}

typedef struct {
    const int32_t *prog;
    const float *consts;
    const float *const *ins;
    const int64_t *in_rs, *in_cs, *rdims;
    void *out;
    int64_t n_instr, n_const, n_regs, n_in, out_rs, cols;
    int out_bool, dense;
    int32_t last;
} ew_args;

/* the program over tile t's n values (inputs at ptr), written to the output at element offset `at` */
static inline void ew_tile(const ew_args *g, float *regs, const float *const *ptr, int64_t n, int64_t at) {
    for (int64_t s = 0; s < g->n_instr; ++s) {
        const int32_t *p = g->prog + 5 * s;
        const float *opd[3];
        for (int j = 0; j < 3; ++j) {
            const int32_t v = p[2 + j];
            opd[j] = v >= 0 ? regs + (int64_t)v * EW_TILE : ptr[-1 - v];
        }
        ew_step(p[0], regs + (int64_t)p[1] * EW_TILE, opd[0], opd[1], opd[2], n);
    }
    const float *res = regs + (int64_t)g->last * EW_TILE;
    if (g->out_bool) {
        uint8_t *ob = (uint8_t *)g->out + at;
        for (int64_t i = 0; i < n; ++i) ob[i] = res[i] != 0.0f;
    } else {
        memcpy((float *)g->out + at, res, (size_t)n * sizeof(float));
    }
}

static inline void ew_next_row(int64_t *idx, const int64_t *rdims) { /* odometer order */
    for (int d = EW_MAX_RDIMS - 1; d >= 0; --d) {
        if (++idx[d] < rdims[d]) break;
        idx[d] = 0;
    }
}

/* rows [r0, r1) of the program, with registers of its own (a thread's share) */
static int ew_rows(const void *args, int64_t r0, int64_t r1) {
    const ew_args *g = (const ew_args *)args;
    const int64_t cols = g->cols, n_in = g->n_in;
    float *regs = (float *)aligned_alloc(64, (size_t)(g->n_regs + n_in) * EW_TILE * sizeof(float));
    if (!regs) return -2;
    float *bcast = regs + g->n_regs * EW_TILE; /* per-row broadcast inputs, splatted */
    for (int64_t r = 0; r < g->n_const; ++r)
        for (int64_t i = 0; i < EW_TILE; ++i) regs[r * EW_TILE + i] = g->consts[r];
    int64_t idx[EW_MAX_RDIMS] = {0, 0, 0, 0};
    for (int64_t d = EW_MAX_RDIMS - 1, r = r0; d >= 0; --d) { /* row r0's index */
        idx[d] = r % g->rdims[d];
        r /= g->rdims[d];
    }
    const float *ptr[EW_MAX_INPUTS];
    if (g->dense) {
        /* Short rows (an SE block's (C, 1, 1) scale on (C, h, w), a 2x2 image's channels): every full input
           and the output lie densely across rows (row r starts r * cols after row 0), so a tile holds whole
           rows and one pass of the program covers EW_TILE / cols of them; a per-row broadcast input is
           splatted row by row into its tile. The same operations on the same values: the same bits. */
        const int64_t per_tile = EW_TILE / cols;
        for (int64_t row0 = r0; row0 < r1; row0 += per_tile) {
            const int64_t nr = r1 - row0 < per_tile ? r1 - row0 : per_tile;
            for (int64_t r = 0; r < nr; ++r) {
                for (int64_t k = 0; k < n_in; ++k) {
                    if (g->in_cs[k]) continue;
                    const int64_t *rs = g->in_rs + k * EW_MAX_RDIMS;
                    const float v = g->ins[k][idx[0] * rs[0] + idx[1] * rs[1] + idx[2] * rs[2] + idx[3] * rs[3]];
                    float *dst = bcast + k * EW_TILE + r * cols;
                    for (int64_t i = 0; i < cols; ++i) dst[i] = v;
                }
                ew_next_row(idx, g->rdims);
            }
            for (int64_t k = 0; k < n_in; ++k)
                ptr[k] = g->in_cs[k] ? g->ins[k] + row0 * cols : bcast + k * EW_TILE;
            ew_tile(g, regs, ptr, nr * cols, row0 * cols);
        }
        free(regs);
        return 0;
    }
    const int64_t tile = cols < EW_TILE ? cols : EW_TILE;
    const float *row_ptr[EW_MAX_INPUTS], *prev[EW_MAX_INPUTS];
    for (int64_t k = 0; k < n_in; ++k) prev[k] = NULL;
    for (int64_t row = r0; row < r1; ++row) {
        for (int64_t k = 0; k < n_in; ++k) {
            const int64_t *rs = g->in_rs + k * EW_MAX_RDIMS;
            row_ptr[k] = g->ins[k] + idx[0] * rs[0] + idx[1] * rs[1] + idx[2] * rs[2] + idx[3] * rs[3];
            if (g->in_cs[k] == 0 && row_ptr[k] != prev[k]) {
                const float v = *row_ptr[k];
                for (int64_t i = 0; i < tile; ++i) bcast[k * EW_TILE + i] = v;
                prev[k] = row_ptr[k];
            }
        }
        for (int64_t c0 = 0; c0 < cols; c0 += EW_TILE) {
            const int64_t n = cols - c0 < EW_TILE ? cols - c0 : EW_TILE;
            for (int64_t k = 0; k < n_in; ++k) ptr[k] = g->in_cs[k] ? row_ptr[k] + c0 : bcast + k * EW_TILE;
            ew_tile(g, regs, ptr, n, row * g->out_rs + c0);
        }
        ew_next_row(idx, g->rdims);
    }
    free(regs);
    return 0;
}

/* the program over rows x cols, rows split over up to nthreads threads (elementwise: the same bits) */
int opstrata_ew_run_f32(const int32_t *prog, int64_t n_instr, const float *consts, int64_t n_const,
                        int64_t n_regs, const float *const *ins, const int64_t *in_rs, const int64_t *in_cs,
                        int64_t n_in, void *out, int64_t out_rs, int out_bool, const int64_t *rdims,
                        int64_t cols, int64_t nthreads) {
    if (n_regs > EW_MAX_REGS || n_in > EW_MAX_INPUTS || n_const > n_regs || n_instr < 1) return -1;
    for (int64_t k = 0; k < n_instr; ++k) {
        const int32_t *ins5 = prog + 5 * k;
        if (ins5[0] < 0 || ins5[0] >= EW_N_OPS || ins5[1] < n_const || ins5[1] >= n_regs) return -1;
        for (int j = 2; j < 5; ++j)
            if (ins5[j] >= n_regs || ins5[j] < -n_in) return -1;
    }
    int64_t rows = 1;
    for (int d = 0; d < EW_MAX_RDIMS; ++d) {
        if (rdims[d] < 0) return -1;
        rows *= rdims[d];
    }
    for (int64_t k = 0; k < n_in; ++k)
        if (in_cs[k] != 0 && in_cs[k] != 1) return -1;
    if (rows == 0 || cols == 0) return 0;
    ew_args g = {prog, consts, ins, in_rs, in_cs, rdims, out, n_instr, n_const, n_regs, n_in, out_rs, cols,
                 out_bool, 0, prog[5 * (n_instr - 1) + 1]};
    g.dense = cols <= EW_TILE / 4 && ew_dense_rows(in_rs, in_cs, n_in, out_rs, rdims, cols);
    return run_ranges(ew_rows, &g, rows, cols * n_instr, nthreads);
}

/* ---------------------------------------------------------------------------------------------------
   Small attention in one call: softmax(q k^T * scale + mask) v per (batch, head), for the short
   sequences where numpy's ten calls and their dispatch cost more than the arithmetic. Grouped-query
   heads (query head h reads kv head h / (H / Hkv)); q / k / v / out are read and written through
   (batch, head, position) strides in elements with a unit last stride, so (B, S, H, D) views need no
   copy. mask_kind 0: none, 1: bool keep (uint8), 2: additive float; mask strides (b, h, n, m) may be 0
   (broadcast). causal keeps key j <= i + M - N (bottom-right aligned). A row whose every key is masked
   gives zeros (and logsumexp -inf), as the numpy kernels; lse (B, H, N), when not NULL, receives each
   row's logsumexp. The scores are scaled q rows against k rows (q * scale first, as
   the numpy kernel), accumulated in float32 lanes; the output is the normalized p against v.
   dims: B, H, Hkv, N, M, D, Dv. Returns 0, or -2 when scratch memory cannot be allocated.
   ------------------------------------------------------------------------------------------------- */
/* y += a x over n floats in explicit vectors (y and x never overlap here) */
static inline void axpy_f32(float *y, float a, const float *x, int64_t n) {
    const vf va = vsplat(a);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        vf r = vload(y + j) + va * vload(x + j);
        memcpy(y + j, &r, sizeof r);
    }
    for (; j < n; ++j) y[j] += a * x[j];
}

int opstrata_attention_f32(const float *q, const float *k, const float *v, const void *mask, float *out,
                           float *lse, const int64_t *dims, const int64_t *qs, const int64_t *ks,
                           const int64_t *vs, const int64_t *os, const int64_t *ms, int mask_kind, int causal,
                           float scale) {
    const int64_t B = dims[0], H = dims[1], HKV = dims[2], N = dims[3], M = dims[4], D = dims[5], DV = dims[6];
    const int64_t group = H / HKV;
    const int64_t M8 = (M + VW - 1) / VW * VW, DV8 = (DV + VW - 1) / VW * VW; /* whole vectors */
    /* scratch: k^T (D, M8), v packed (M, DV8), one score row (M8), one scaled q row (D), one out row */
    float *kt = (float *)calloc((size_t)(D * M8 + M * DV8 + M8 + D + DV8), sizeof(float));
    if (!kt) return -2;
    float *vp = kt + D * M8, *srow = vp + M * DV8, *qrow = srow + M8, *orow = qrow + D;
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < H; ++h) {
            const int64_t kvh = h / group;
            if (h % group == 0) { /* k^T and v of this kv head, packed once for its group */
                const float *kb = k + b * ks[0] + kvh * ks[1];
                const float *vb = v + b * vs[0] + kvh * vs[1];
                for (int64_t j = 0; j < M; ++j) {
                    for (int64_t d = 0; d < D; ++d) kt[d * M8 + j] = kb[j * ks[2] + d];
                    memcpy(vp + j * DV8, vb + j * vs[2], (size_t)DV * sizeof(float));
                }
            }
            for (int64_t i = 0; i < N; ++i) {
                const float *qi = q + b * qs[0] + h * qs[1] + i * qs[2];
                float *oi = out + b * os[0] + h * os[1] + i * os[2];
                for (int64_t d = 0; d < D; ++d) qrow[d] = qi[d] * scale;
                for (int64_t jb = 0; jb < M8; jb += VW) { /* scores: accumulators stay in registers */
                    vf acc = vsplat(0.0f);
                    for (int64_t d = 0; d < D; ++d) acc += vsplat(qrow[d]) * vload(kt + d * M8 + jb);
                    memcpy(srow + jb, &acc, sizeof acc);
                }
                if (mask_kind) {
                    const int64_t mo = b * ms[0] + h * ms[1] + i * ms[2];
                    if (mask_kind == 1) {
                        const uint8_t *mr = (const uint8_t *)mask + mo;
                        for (int64_t j = 0; j < M; ++j) srow[j] = mr[j * ms[3]] ? srow[j] : -INFINITY;
                    } else if (ms[3] == 1) {
                        const float *mr = (const float *)mask + mo;
                        for (int64_t j = 0; j < M; ++j) srow[j] += mr[j];
                    } else {
                        const float *mr = (const float *)mask + mo;
                        for (int64_t j = 0; j < M; ++j) srow[j] += mr[j * ms[3]];
                    }
                }
                int64_t jmax = M;
                if (causal) {
                    jmax = i + M - N + 1;
                    if (jmax < 0) jmax = 0;
                    if (jmax > M) jmax = M;
                }
                float mx = -INFINITY;
                for (int64_t j = 0; j < jmax; ++j) mx = srow[j] > mx ? srow[j] : mx;
                if (mx == -INFINITY) { /* every key masked: zeros (a row of NaN: NaN) */
                    int has_nan = 0;
                    for (int64_t j = 0; j < jmax; ++j) has_nan |= srow[j] != srow[j];
                    for (int64_t d = 0; d < DV; ++d) oi[d] = has_nan ? NAN : 0.0f;
                    if (lse) lse[(b * H + h) * N + i] = has_nan ? NAN : -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < jmax; ++j) srow[j] = exp_f32(srow[j] - mx);
                double sum = 0.0; /* in double, as the row softmax: the logsumexp feeds the backward */
                for (int64_t j = 0; j < jmax; ++j) sum += srow[j];
                const float inv = (float)(1.0 / sum);
                if (lse) lse[(b * H + h) * N + i] = (float)((double)mx + log(sum));
                for (int64_t db = 0; db < DV8; db += VW) { /* p v: accumulators stay in registers */
                    vf acc = vsplat(0.0f);
                    for (int64_t j = 0; j < jmax; ++j) acc += vsplat(srow[j] * inv) * vload(vp + j * DV8 + db);
                    memcpy(orow + db, &acc, sizeof acc);
                }
                memcpy(oi, orow, (size_t)DV * sizeof(float));
            }
        }
    }
    free(kt);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
   Rotate-half RoPE as exporters write it: out = x cos + concat(-x2, x1) sin, rows of D = 2h channels.
   Rows walk up to four row dims (row-major); x and out are C-contiguous rows, cos / sin are read at
   their own per-dim row strides and a column stride of 0 (one value per row) or 1. The products are
   rounded before the add / subtract (no FMA contraction), so the result is the unfused graph's, bit
   for bit: first half x1 c1 - x2 s1, second half x2 c2 + x1 s2.
   ------------------------------------------------------------------------------------------------- */
__attribute__((optimize("fp-contract=off"))) void
opstrata_rope_half_f32(const float *x, const float *cs, const float *sn, float *out, const int64_t *rdims,
                       const int64_t *c_rs, const int64_t *s_rs, int64_t c_cs, int64_t s_cs, int64_t d) {
    const int64_t h = d / 2;
    int64_t idx[4] = {0, 0, 0, 0};
    const int64_t rows = rdims[0] * rdims[1] * rdims[2] * rdims[3];
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * d;
        float *o = out + r * d;
        const float *c = cs + idx[0] * c_rs[0] + idx[1] * c_rs[1] + idx[2] * c_rs[2] + idx[3] * c_rs[3];
        const float *s = sn + idx[0] * s_rs[0] + idx[1] * s_rs[1] + idx[2] * s_rs[2] + idx[3] * s_rs[3];
        if (c_cs == 1 && s_cs == 1) {
            for (int64_t j = 0; j < h; ++j) {
                const float a = xr[j] * c[j], b = xr[j + h] * s[j];
                o[j] = a - b;
            }
            for (int64_t j = 0; j < h; ++j) {
                const float a = xr[j + h] * c[j + h], b = xr[j] * s[j + h];
                o[j + h] = a + b;
            }
        } else {
            for (int64_t j = 0; j < h; ++j) {
                const float a = xr[j] * c[j * c_cs], b = xr[j + h] * s[j * s_cs];
                o[j] = a - b;
            }
            for (int64_t j = 0; j < h; ++j) {
                const float a = xr[j + h] * c[(j + h) * c_cs], b = xr[j] * s[(j + h) * s_cs];
                o[j + h] = a + b;
            }
        }
        for (int k = 3; k >= 0; --k) {
            if (++idx[k] < rdims[k]) break;
            idx[k] = 0;
        }
    }
}

/* ---------------------------------------------------------------------------------------------------
   Packed calls: a bound kernel call as (function id, int64 argument block) -- pointers as addresses,
   floats as the bits of a double -- so Python passes two arguments instead of converting a dozen
   (ctypes spends ~0.2 us per argument), and a run of consecutive bound native steps is one call of
   opstrata_call_batch (the CPU analogue of replaying a captured graph). Ids match native/packed.py.
   ------------------------------------------------------------------------------------------------- */
static inline float packed_f32(int64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return (float)d;
}

/* The BLAS sgemm numpy itself calls (its bundled OpenBLAS, found by native/blas.py), so a GEMM step can run
   inside a batch with the numpy call's exact arguments -- hence its exact bits. ilp64: 64-bit integers. */
/* cblas's enums (order, transposes) are ints; with 64-bit integers (ILP64) only the sizes widen */
typedef void (*sgemm64_fn)(int order, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
typedef void (*sgemm32_fn)(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                           const float *b, int ldb, float beta, float *c, int ldc);
typedef void (*sgemv64_fn)(int order, int ta, int64_t m, int64_t n, float alpha, const float *a, int64_t lda,
                           const float *x, int64_t incx, float beta, float *y, int64_t incy);
typedef void (*sgemv32_fn)(int order, int ta, int m, int n, float alpha, const float *a, int lda, const float *x,
                           int incx, float beta, float *y, int incy);
static void *sgemm_ptr = 0, *sgemv_ptr = 0;
static int sgemm_ilp64 = 0;

void opstrata_set_sgemm(void *gemm, void *gemv, int ilp64) {
    sgemm_ptr = gemm;
    sgemv_ptr = gemv;
    sgemm_ilp64 = ilp64;
}

/* batch y = A x for row-major A (m, k) and contiguous x, y: numpy's matrix @ vector, which calls
   cblas_sgemv(ColMajor, Trans, k, m, 1, A, k, x, 1, 0, y, 1) for each batch entry. */
static int batched_sgemv(const float *a, const float *x, float *y, int64_t m, int64_t k, int64_t batch, int64_t sa,
                         int64_t sx, int64_t sy) {
    if (!sgemv_ptr) return -2;
    for (int64_t i = 0; i < batch; ++i) {
        if (sgemm_ilp64) {
            ((sgemv64_fn)sgemv_ptr)(102, 112, k, m, 1.0f, a + i * sa, k, x + i * sx, 1, 0.0f, y + i * sy, 1);
        } else {
            ((sgemv32_fn)sgemv_ptr)(102, 112, (int)k, (int)m, 1.0f, a + i * sa, (int)k, x + i * sx, 1, 0.0f,
                                    y + i * sy, 1);
        }
    }
    return 0;
}

/* row-major C (m, n) = alpha A (m, k) op(B) through numpy's BLAS (op: B^T when tb), leading dims in elements */
static void sgemm_rm(int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                     const float *b, int64_t ldb, float *c, int64_t ldc) {
    const int opb = tb ? 112 : 111;
    if (sgemm_ilp64)
        ((sgemm64_fn)sgemm_ptr)(101, 111, opb, m, n, k, alpha, a, lda, b, ldb, 0.0f, c, ldc);
    else
        ((sgemm32_fn)sgemm_ptr)(101, 111, opb, (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, 0.0f, c,
                                (int)ldc);
}

/* batch row-major C = A op(B) (op: transpose when tb, alpha 1, beta 0), A / B / C advancing by sa / sb / sc
   elements per batch entry -- numpy's matmul loop over the leading dims calling cblas_sgemm for each. */
static int batched_sgemm(const float *a, const float *b, float *c, int64_t m, int64_t n, int64_t k, int64_t lda,
                         int64_t ldb, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc, int64_t tb) {
    if (!sgemm_ptr) return -2;
    for (int64_t i = 0; i < batch; ++i) sgemm_rm((int)tb, m, n, k, 1.0f, a + i * sa, lda, b + i * sb, ldb, c + i * sc, ldc);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------
   Attention past the one-call loop kernel's size (opstrata_attention_f32: the same arguments and
   conventions, plus threads): per (batch, head) and block of up to ATTN_ROWS query rows, the scores as one
   BLAS sgemm (alpha = scale, K read transposed where it lies), the mask, the causal cut and the softmax per
   row in C with p normalised in place, then p v as a second sgemm written straight into out's rows. A causal
   block multiplies only the keys its last row sees. (batch, head, block) items split over the pool; each
   item's result does not depend on the split. Returns 0, -2 (no scratch memory) or -3 (no BLAS bound).
   ------------------------------------------------------------------------------------------------- */
#define ATTN_ROWS 64

typedef struct {
    const float *q, *k, *v;
    const void *mask;
    float *out, *lse;
    int64_t B, H, group, N, M, D, DV, blocks;
    const int64_t *qs, *ks, *vs, *os, *ms;
    int mask_kind, causal;
    float scale;
} attn_blas_args;

static int attn_blas_items(const void *arg, int64_t i0, int64_t i1) {
    const attn_blas_args *g = (const attn_blas_args *)arg;
    const int64_t N = g->N, M = g->M;
    float *p = (float *)malloc(sizeof(float) * (size_t)(ATTN_ROWS * (M ? M : 1)));
    if (!p) return -2;
    for (int64_t it = i0; it < i1; ++it) {
        const int64_t blk = it % g->blocks, bh = it / g->blocks, b = bh / g->H, h = bh % g->H;
        const int64_t kvh = h / g->group, r0 = blk * ATTN_ROWS;
        const int64_t rows = N - r0 < ATTN_ROWS ? N - r0 : ATTN_ROWS;
        int64_t cols = M; /* keys any row of the block sees */
        if (g->causal) {
            cols = r0 + rows + M - N;
            cols = cols < 0 ? 0 : (cols > M ? M : cols);
        }
        const float *qb = g->q + b * g->qs[0] + h * g->qs[1] + r0 * g->qs[2];
        const float *kb = g->k + b * g->ks[0] + kvh * g->ks[1];
        const float *vb = g->v + b * g->vs[0] + kvh * g->vs[1];
        float *ob = g->out + b * g->os[0] + h * g->os[1] + r0 * g->os[2];
        if (cols == 0) { /* no key visible to any row: zeros, logsumexp -inf */
            for (int64_t r = 0; r < rows; ++r) {
                for (int64_t d = 0; d < g->DV; ++d) ob[r * g->os[2] + d] = 0.0f;
                if (g->lse) g->lse[(b * g->H + h) * N + r0 + r] = -INFINITY;
            }
            continue;
        }
        sgemm_rm(1, rows, cols, g->D, g->scale, qb, g->qs[2], kb, g->ks[2], p, cols);
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = r0 + r;
            float *srow = p + r * cols;
            int64_t jmax = cols;
            if (g->causal) {
                jmax = i + M - N + 1;
                jmax = jmax < 0 ? 0 : (jmax > cols ? cols : jmax);
            }
            if (g->mask_kind) {
                const int64_t mo = b * g->ms[0] + h * g->ms[1] + i * g->ms[2], m3 = g->ms[3];
                if (g->mask_kind == 1) {
                    const uint8_t *mr = (const uint8_t *)g->mask + mo;
                    for (int64_t j = 0; j < jmax; ++j) srow[j] = mr[j * m3] ? srow[j] : -INFINITY;
                } else {
                    const float *mr = (const float *)g->mask + mo;
                    if (m3 == 1)
                        for (int64_t j = 0; j < jmax; ++j) srow[j] += mr[j];
                    else
                        for (int64_t j = 0; j < jmax; ++j) srow[j] += mr[j * m3];
                }
            }
            const float mx = row_max(srow, jmax);
            float *lse_i = g->lse ? g->lse + (b * g->H + h) * N + i : NULL;
            if (mx == -INFINITY) { /* every key masked: zeros (a row of NaN: NaN), through the p v product */
                int has_nan = 0;
                for (int64_t j = 0; j < jmax; ++j) has_nan |= srow[j] != srow[j];
                for (int64_t j = 0; j < cols; ++j) srow[j] = has_nan ? NAN : 0.0f;
                if (lse_i) *lse_i = has_nan ? NAN : -INFINITY;
                continue;
            }
            for (int64_t j = 0; j < jmax; ++j) srow[j] = exp_f32(srow[j] - mx);
            const double sum = row_sum(srow, jmax); /* vector partial sums, combined in double */
            const float inv = (float)(1.0 / sum);
            if (lse_i) *lse_i = (float)((double)mx + log(sum));
            for (int64_t j = 0; j < jmax; ++j) srow[j] *= inv;
            for (int64_t j = jmax; j < cols; ++j) srow[j] = 0.0f; /* keys after a causal row's last */
        }
        sgemm_rm(0, rows, g->DV, cols, 1.0f, p, cols, vb, g->vs[2], ob, g->os[2]);
    }
    free(p);
    return 0;
}

int opstrata_attention_blas_f32(const float *q, const float *k, const float *v, const void *mask, float *out,
                                float *lse, const int64_t *dims, const int64_t *qs, const int64_t *ks,
                                const int64_t *vs, const int64_t *os, const int64_t *ms, int mask_kind, int causal,
                                float scale, int64_t nthreads) {
    if (!sgemm_ptr) return -3;
    const int64_t B = dims[0], H = dims[1], HKV = dims[2], N = dims[3], M = dims[4], D = dims[5], DV = dims[6];
    if (B <= 0 || H <= 0 || N <= 0) return 0;
    const int64_t blocks = (N + ATTN_ROWS - 1) / ATTN_ROWS;
    const attn_blas_args g = {q, k, v, mask, out, lse, B, H, H / HKV, N, M, D, DV, blocks,
                              qs, ks, vs, os, ms, mask_kind, causal, scale};
    return run_ranges(attn_blas_items, &g, B * H * blocks, ATTN_ROWS * M * (D + DV), nthreads);
}

/* numpy's pairwise float32 sum of n contiguous values (loops_utils.h's pairwise_sum: under 8 a plain loop,
   up to 128 eight interleaved partial sums, above that the halves at a multiple of 8), so that a sum over
   a row gives np.sum's bits; the caller adds it to 0 as numpy's reduce does. */
static float np_pairwise_sum_f32(const float *a, int64_t n) {
    if (n < 8) {
        float res = 0.0f;
        for (int64_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_pairwise_sum_f32(a, n2) + np_pairwise_sum_f32(a + n2, n - n2);
}

#define P(i, T) ((T)(intptr_t)a[i])

int opstrata_call_packed(int64_t fn, const int64_t *a) {
    switch (fn) {
    case 1:
        return opstrata_ew_run_f32(P(0, const int32_t *), a[1], P(2, const float *), a[3], a[4],
                                   P(5, const float *const *), P(6, const int64_t *), P(7, const int64_t *), a[8],
                                   P(9, void *), a[10], (int)a[11], P(12, const int64_t *), a[13], a[14]);
    case 2:
        return opstrata_depthwise_conv2d_f32(P(0, const float *), P(1, const float *), P(2, const float *),
                                             P(3, float *), a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                                             a[12], a[13], a[14], a[15], a[16], a[17], a[18]);
    case 3:
        opstrata_im2col_f32(P(0, const float *), P(1, float *), a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                            a[10], a[11], a[12], a[13], a[14], a[15], a[16]);
        return 0;
    case 4:
        return opstrata_max_pool2d_f32(P(0, const float *), P(1, float *), a[2], a[3], a[4], a[5], a[6], a[7],
                                       a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16]);
    case 5:
        opstrata_layer_norm_f32(P(0, const float *), P(1, const float *), P(2, const float *), P(3, float *), a[4],
                                a[5], packed_f32(a[6]));
        return 0;
    case 6:
        opstrata_rms_norm_f32(P(0, const float *), P(1, const float *), P(2, float *), a[3], a[4], packed_f32(a[5]));
        return 0;
    case 7:
        opstrata_rope_half_f32(P(0, const float *), P(1, const float *), P(2, const float *), P(3, float *),
                               P(4, const int64_t *), P(5, const int64_t *), P(6, const int64_t *), a[7], a[8], a[9]);
        return 0;
    case 8:
        return opstrata_attention_f32(P(0, const float *), P(1, const float *), P(2, const float *),
                                      P(3, const void *), P(4, float *), P(5, float *), P(6, const int64_t *),
                                      P(7, const int64_t *), P(8, const int64_t *), P(9, const int64_t *),
                                      P(10, const int64_t *), P(11, const int64_t *), (int)a[12], (int)a[13],
                                      packed_f32(a[14]));
    case 18:
        return opstrata_sgemm_fma_f32(P(0, const float *), P(1, const float *), P(2, float *), P(3, const float *),
                                      a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]);
    case 19:
        return opstrata_sgemm_fma_epi_f32(P(0, const float *), P(1, const float *), P(2, float *),
                                          P(3, const float *), a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                                          a[12], a[13], a[14], a[15], a[16], P(17, const float *),
                                          P(18, const float *));
    case 24:
        return opstrata_sgemm_lanes_f32(P(0, const float *), P(1, const float *), P(2, float *), P(3, const float *),
                                        a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
                                        a[16], P(17, const float *), P(18, const float *));
    case 27:
        return opstrata_linear_packed_f32(P(0, const float *), P(1, const float *), P(2, float *), a[3], a[4], a[5],
                                          a[6], a[7], a[8]);
    case 26:
        return opstrata_depthwise_lanes_f32(P(0, const float *), P(1, const float *), P(2, const float *),
                                            P(3, float *), a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                                            a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19],
                                            P(20, const float *));
    case 25:
        return opstrata_conv_gather_f32(P(0, const float *), P(1, const float *), P(2, const float *), P(3, float *),
                                        a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
                                        a[16], a[17], a[18], a[19], a[20], a[21], P(22, const float *),
                                        P(23, const float *));
    case 23:
        return opstrata_conv_direct_f32(P(0, const float *), P(1, const float *), P(2, const float *), P(3, float *),
                                        a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15],
                                        a[16], a[17], a[18], P(19, const float *), P(20, const float *));
    case 9:
        return opstrata_bias_act_f32(P(0, const float *), P(1, const float *), P(2, float *), a[3], a[4], (int)a[5]);
    case 11: { /* out (rows, cols) += bias[row]: numpy's out += b[:, None] (one float add each, same bits) */
        float *o = P(0, float *);
        const float *b = P(1, const float *);
        const int64_t rows = a[2], cols = a[3], reps = a[4];
        for (int64_t r = 0; r < reps * rows; ++r) {
            const float v = b[r % rows];
            float *orow = o + r * cols;
            for (int64_t j = 0; j < cols; ++j) orow[j] = orow[j] + v;
        }
        return 0;
    }
    case 13: { /* out = x (+ - * /) y over n floats (out may be x or y): numpy's ufunc, one rounding, same bits */
        const float *x = P(0, const float *), *y = P(1, const float *);
        float *o = P(2, float *);
        const int64_t n = a[3];
        switch (a[4]) {
        case 0: for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i]; return 0;
        case 1: for (int64_t i = 0; i < n; ++i) o[i] = x[i] - y[i]; return 0;
        case 2: for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i]; return 0;
        case 3: for (int64_t i = 0; i < n; ++i) o[i] = x[i] / y[i]; return 0;
        default: return -1001;
        }
    }
    case 22:
        return opstrata_attention_blas_f32(P(0, const float *), P(1, const float *), P(2, const float *),
                                           P(3, const void *), P(4, float *), P(5, float *), P(6, const int64_t *),
                                           P(7, const int64_t *), P(8, const int64_t *), P(9, const int64_t *),
                                           P(10, const int64_t *), P(11, const int64_t *), (int)a[12], (int)a[13],
                                           packed_f32(a[14]), a[15]);
    case 21:
        opstrata_softmax_rows_f32(P(0, const float *), P(1, float *), P(2, float *), a[3], a[4]);
        return 0;
    case 20: { /* out (rows, cols) = x (+ - * /) y with one operand holding one value per row (a per-channel
                  scale / shift: numpy's broadcast ufunc, one rounding each, same bits); a[6]: the per-row
                  operand is x (1) or y (0) */
        const float *x = P(0, const float *), *y = P(1, const float *);
        float *o = P(2, float *);
        const int64_t rows = a[3], cols = a[4], op = a[5], row_is_x = a[6];
        if (op < 0 || op > 3) return -1001;
        for (int64_t r = 0; r < rows; ++r) {
            float *orow = o + r * cols;
            if (row_is_x) {
                const float v = x[r], *yr = y + r * cols;
                switch (op) {
                case 0: for (int64_t i = 0; i < cols; ++i) orow[i] = v + yr[i]; break;
                case 1: for (int64_t i = 0; i < cols; ++i) orow[i] = v - yr[i]; break;
                case 2: for (int64_t i = 0; i < cols; ++i) orow[i] = v * yr[i]; break;
                default: for (int64_t i = 0; i < cols; ++i) orow[i] = v / yr[i]; break;
                }
            } else {
                const float v = y[r], *xr = x + r * cols;
                switch (op) {
                case 0: for (int64_t i = 0; i < cols; ++i) orow[i] = xr[i] + v; break;
                case 1: for (int64_t i = 0; i < cols; ++i) orow[i] = xr[i] - v; break;
                case 2: for (int64_t i = 0; i < cols; ++i) orow[i] = xr[i] * v; break;
                default: for (int64_t i = 0; i < cols; ++i) orow[i] = xr[i] / v; break;
                }
            }
        }
        return 0;
    }
    case 14: { /* dst = src, both strided views of up to 6 dims (strides in bytes; a null dst stride array: dst is
                  C-contiguous): a copy of fixed views, nothing computed */
        const char *src = P(0, const char *);
        char *dst = P(1, char *);
        const int64_t item = a[2], nd = a[3];
        const int64_t *shape = P(4, const int64_t *), *st = P(5, const int64_t *), *dt = P(6, const int64_t *);
        int64_t dims[6] = {1, 1, 1, 1, 1, 1}, ss[6] = {0, 0, 0, 0, 0, 0}, ds[6] = {0, 0, 0, 0, 0, 0};
        int64_t run = item, k = 6; /* dims from the innermost, size-1 dims dropped, and a dim merged into the
                                      one inside it where both views are contiguous across them (a channel
                                      slice of a batch-1 image is one block: one memcpy, not one per row) */
        for (int64_t d = nd - 1; d >= 0; --d) {
            const int64_t sd = st[d], dd = dt ? dt[d] : run;
            run *= shape[d];
            if (shape[d] == 1) continue;
            if (k < 6 && sd == ss[k] * dims[k] && dd == ds[k] * dims[k]) {
                dims[k] *= shape[d];
                continue;
            }
            --k;
            dims[k] = shape[d];
            ss[k] = sd;
            ds[k] = dd;
        }
        if (k == 6) { /* every dim of size 1: one item */
            dims[5] = 1;
            ss[5] = ds[5] = item;
        }
        const int rows_contiguous = ss[5] == item && ds[5] == item;
        const size_t row = (size_t)(dims[5] * item);
        for (int64_t i0 = 0; i0 < dims[0]; ++i0)
            for (int64_t i1 = 0; i1 < dims[1]; ++i1)
                for (int64_t i2 = 0; i2 < dims[2]; ++i2)
                    for (int64_t i3 = 0; i3 < dims[3]; ++i3)
                        for (int64_t i4 = 0; i4 < dims[4]; ++i4) {
                            const char *s0 = src + i0 * ss[0] + i1 * ss[1] + i2 * ss[2] + i3 * ss[3] + i4 * ss[4];
                            char *d0 = dst + i0 * ds[0] + i1 * ds[1] + i2 * ds[2] + i3 * ds[3] + i4 * ds[4];
                            if (rows_contiguous) {
                                memcpy(d0, s0, row);
                            } else {
                                for (int64_t j = 0; j < dims[5]; ++j)
                                    memcpy(d0 + j * ds[5], s0 + j * ss[5], (size_t)item);
                            }
                        }
        return 0;
    }
    case 15: { /* out (outer, m, inner) = table (outer, n, inner)[:, idx, :] with int64 idx (negative from the
                  end, as np.take); an index outside [-n, n) returns -3 before anything is written */
        const char *t = P(0, const char *);
        const int64_t *idx = P(1, const int64_t *);
        char *o = P(2, char *);
        const int64_t outer = a[3], n = a[4], inner_bytes = a[5], m = a[6];
        for (int64_t j = 0; j < m; ++j)
            if (idx[j] < -n || idx[j] >= n) return -3;
        for (int64_t p = 0; p < outer; ++p)
            for (int64_t j = 0; j < m; ++j) {
                const int64_t r = idx[j] < 0 ? idx[j] + n : idx[j];
                memcpy(o + (p * m + j) * inner_bytes, t + (p * n + r) * inner_bytes, (size_t)inner_bytes);
            }
        return 0;
    }
    case 16: { /* out[r] = (0 + sum(x[r, :n])) / n over rows: np.sum then np.divide by the count */
        const float *x = P(0, const float *);
        float *o = P(1, float *);
        const int64_t rows = a[2], n = a[3];
        const float count = (float)n;
        for (int64_t r = 0; r < rows; ++r) o[r] = (0.0f + np_pairwise_sum_f32(x + r * n, n)) / count;
        return 0;
    }
    case 17:
        return batched_sgemv(P(0, const float *), P(1, const float *), P(2, float *), a[3], a[4], a[5], a[6], a[7],
                             a[8]);
    case 10:
        return batched_sgemm(P(0, const float *), P(1, const float *), P(2, float *), a[3], a[4], a[5], a[6], a[7],
                             a[8], a[9], a[10], a[11], a[12], a[13]);
    case 12: { /* out (rows, cols) += bias[col]: numpy's out += b over the last dim (same bits) */
        float *o = P(0, float *);
        const float *b = P(1, const float *);
        const int64_t rows = a[2], cols = a[3];
        for (int64_t r = 0; r < rows; ++r) {
            float *orow = o + r * cols;
            for (int64_t j = 0; j < cols; ++j) orow[j] = orow[j] + b[j];
        }
        return 0;
    }
    case 29: { /* out = np.maximum(x, 0) over n floats: NaN stays NaN, -0 and +0 give +0 (numpy's bits) */
        const float *x = P(0, const float *);
        float *o = P(1, float *);
        const int64_t n = a[2];
        for (int64_t i = 0; i < n; ++i) o[i] = x[i] > 0.0f ? x[i] : (x[i] == x[i] ? 0.0f : x[i]);
        return 0;
    }
    case 30:
        opstrata_avg_pool2d_f32(P(0, const float *), P(1, float *), a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9],
                                a[10], a[11], a[12]);
        return 0;
    case 28: /* another library's packed entry point, int fn(const int64_t *args): a[0] its address, its
                arguments from a[1] on -- so a batch can run kernels of several native libraries in order */
        return ((int (*)(const int64_t *))(intptr_t)a[0])(a + 1);
    default:
        return -1000; /* an unknown id: the bindings and the library disagree */
    }
}

#undef P

/* Run n packed calls (cmds: n pairs of function id, argument block address) in order; on the first that
   fails, stores its index in *failed and returns its code. */
int opstrata_call_batch(const int64_t *cmds, int64_t n, int64_t *failed) {
    for (int64_t i = 0; i < n; ++i) {
        const int rc = opstrata_call_packed(cmds[2 * i], (const int64_t *)(intptr_t)cmds[2 * i + 1]);
        if (rc != 0) {
            *failed = i;
            return rc;
        }
    }
    return 0;
}
