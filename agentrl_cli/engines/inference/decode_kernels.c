/* The decode step's work between its matrix multiplies, float32, for decode_kernels.py (which builds
 * this with the machine's C compiler; see there for why):
 *
 * decode_attend  attention of one query per row over the row's cached keys and values, grouped
 *                query heads (query head h reads key-value head h / (heads / kv_heads), as Hugging
 *                Face's repeat_kv pairs them);
 * rms_norm       Llama's RMSNorm with its weight;
 * rope           rotary embedding in place, Hugging Face's rotate_half layout;
 * silu_mul       the gated MLP's silu(gate) * up, in place into gate;
 * sample_rows    the sampler's inverse-CDF draw and log-prob for rows that truncate nothing;
 * decode_layers  the whole decode step after the embedding lookup: every layer (the functions above
 *                between its matrix multiplies, which go to the BLAS `sgemm_` torch itself calls,
 *                passed in as a function pointer), the final norm and the output head, in one call.
 *
 * decode_attend:
 * q     [rows, heads, dim]            contiguous
 * k, v  [rows, kv_heads, cols, dim]   strided views (the cache's buffers): element strides given, dim's is 1
 * mask  [rows, cols]                  contiguous bytes, 1 where the row attends, 0 on its padding
 * out   [rows, heads, dim]            contiguous
 * shared [rows, 3] int32 or NULL      per row (source row, lo, hi): its columns [lo, hi) hold copies of
 *                                     the source row's (a prompt prefix the rows share), read from the
 *                                     source row, so rows sharing a prefix read one copy of it
 * Work is split over `threads` OpenMP threads by (row, kv head); each task reads its keys and values
 * from memory once for every query head of its group, the next task's prefetched meanwhile. */

#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *q, *k, *v;
    const unsigned char *mask;
    const int *shared;
    float *out;
    long ks0, ks1, ks2, vs0, vs1, vs2;
    int rows, heads, kv_heads, cols, dim, first, last, qpr;
    float scale;
    int failed;
} job_t;

static inline void prefetch_row(const float *row, int dim) {
    /* 16 floats: one 64-byte line; into the outer caches (locality 1): prefetched into the first-level
     * cache, the next task's rows evicted this one's (measured: 15 ms a step at 64 rows of SmolLM2
     * against 20 with locality 3) */
    for (int d = 0; d < dim; d += 16) __builtin_prefetch(row + d, 0, 1);
}

/* Where a task's cached column c lives: its own row's block, or for the columns [lo, hi) it shares
 * with other rows, the source row's block (the same values), which stays in cache from one row of the
 * prefix to the next instead of each row reading its own copy from memory. */
typedef struct {
    const float *own, *shared;
    long stride;
    int lo, hi;
} src_t;

static inline const float *at(const src_t *s, int c) {
    return (c >= s->lo && c < s->hi ? s->shared : s->own) + c * s->stride;
}

/* Head dims that are a multiple of VW floats take the vector paths below (GCC vector extensions:
 * one AVX-512 register, or two AVX2 ones where the CPU has no AVX-512). */
enum { VW = 16, MAX_DIM = 256 };
typedef float vf __attribute__((vector_size(VW * sizeof(float))));

static inline vf load_vf(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float sum_vf(vf v) {
    float s = 0.f;
    for (int i = 0; i < VW; i++) s += v[i];
    return s;
}

/* scores[h][c] = q_h . k_c * scale, four key rows at a time for every query head of the group (four
 * independent sums, so the adds do not wait on each other): each key row is read from memory once,
 * while the next task's rows are prefetched; the heads after the first find it in cache. */
static void scores_vec(const float *qg, const src_t *kb, const src_t *kn, float *scores,
                       int group, int cols, int dim, float scale) {
    const int n = dim / VW;
    int c = 0;
    for (; c + 4 <= cols; c += 4) {
        const float *k0 = at(kb, c), *k1 = at(kb, c + 1), *k2 = at(kb, c + 2), *k3 = at(kb, c + 3);
        for (int e = 0; e < 4; e++) prefetch_row(at(kn, c + e), dim);
        for (int h = 0; h < group; h++) {
            const float *qh = qg + (long)h * dim;
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int i = 0; i < n; i++) {
                const vf q = load_vf(qh + i * VW);
                a0 += q * load_vf(k0 + i * VW);
                a1 += q * load_vf(k1 + i * VW);
                a2 += q * load_vf(k2 + i * VW);
                a3 += q * load_vf(k3 + i * VW);
            }
            float *s = scores + (long)h * cols + c;
            s[0] = sum_vf(a0) * scale;
            s[1] = sum_vf(a1) * scale;
            s[2] = sum_vf(a2) * scale;
            s[3] = sum_vf(a3) * scale;
        }
    }
    for (; c < cols; c++) {
        prefetch_row(at(kn, c), dim);
        const float *kc = at(kb, c);
        for (int h = 0; h < group; h++) {
            vf a = {0};
            for (int i = 0; i < n; i++) a += load_vf(qg + (long)h * dim + i * VW) * load_vf(kc + i * VW);
            scores[(long)h * cols + c] = sum_vf(a) * scale;
        }
    }
}

/* og[h] = sum_c p[h][c] v_c over the attended columns: each value row read from memory once (the next
 * task's prefetched meanwhile) and added into every head's output, which stays in cache. */
static void weighted_values_vec(const src_t *vb, const src_t *vn, const unsigned char *mask,
                                const float *scores, float *og, int group, int cols, int dim) {
    const int n = dim / VW;
    memset(og, 0, sizeof(float) * (size_t)group * (size_t)dim);
    for (int c = 0; c < cols; c++) {
        prefetch_row(at(vn, c), dim);
        if (!mask[c]) continue;
        vf v[MAX_DIM / VW];
        const float *vc = at(vb, c);
        for (int i = 0; i < n; i++) v[i] = load_vf(vc + i * VW);
        for (int h = 0; h < group; h++) {
            const float p = scores[(long)h * cols + c];
            float *oh = og + (long)h * dim;
            for (int i = 0; i < n; i++) {
                const vf o = load_vf(oh + i * VW) + p * v[i];
                memcpy(oh + i * VW, &o, sizeof o);
            }
        }
    }
}

/* task t's (row t / kv_heads, head t % kv_heads) block of the cache `base` with its shared columns */
static src_t source(const job_t *j, const float *base, long s0, long s1, long s2, int t) {
    const int r = t / j->kv_heads / j->qpr, g = t % j->kv_heads;
    src_t s = {base + r * s0 + g * s1, base + r * s0 + g * s1, s2, 0, 0};
    if (j->shared && j->shared[3 * r + 2] > j->shared[3 * r + 1]) {
        s.shared = base + (long)j->shared[3 * r] * s0 + g * s1;
        s.lo = j->shared[3 * r + 1];
        s.hi = j->shared[3 * r + 2];
    }
    return s;
}

static int run_tasks(job_t *j) {
    const int group = j->heads / j->kv_heads, dim = j->dim;
    float *scores = malloc(sizeof(float) * (size_t)group * (size_t)(j->cols > 0 ? j->cols : 1));
    if (!scores) return 1;
    for (int t = j->first; t < j->last; t++) {
        /* query row qr (row r's token qr % qpr of qpr) and key-value head g; token i of a row's qpr
         * attends up to its own column, cols - qpr + i (causal within a prefill) */
        const int qr = t / j->kv_heads, g = t % j->kv_heads, r = qr / j->qpr;
        const int cols = j->cols - (j->qpr - 1 - qr % j->qpr);
        const src_t kb = source(j, j->k, j->ks0, j->ks1, j->ks2, t), vb = source(j, j->v, j->vs0, j->vs1, j->vs2, t);
        /* the next task's keys and values are fetched while this one computes: each task's are a
         * separate block of the cache, which the hardware prefetcher would start on cold */
        const int next = t + 1 < j->last ? t + 1 : t;
        const src_t kn = source(j, j->k, j->ks0, j->ks1, j->ks2, next), vn = source(j, j->v, j->vs0, j->vs1, j->vs2, next);
        const unsigned char *restrict mask = j->mask + (long)r * j->cols;
        const float *restrict qg = j->q + ((long)qr * j->heads + (long)g * group) * dim;
        float *restrict og = j->out + ((long)qr * j->heads + (long)g * group) * dim;
        if (dim % VW == 0 && dim <= MAX_DIM) {
            scores_vec(qg, &kb, &kn, scores, group, cols, dim, j->scale);
        } else {
            for (int c = 0; c < cols; c++) {  /* each key row read once, for every query head of the group */
                const float *restrict kc = at(&kb, c);
                prefetch_row(at(&kn, c), dim);
                for (int h = 0; h < group; h++) {
                    const float *restrict qh = qg + (long)h * dim;
                    float acc = 0.f;
                    for (int d = 0; d < dim; d++) acc += qh[d] * kc[d];
                    scores[(long)h * cols + c] = acc * j->scale;
                }
            }
        }
        for (int h = 0; h < group; h++) {
            float *s = scores + (long)h * cols;
            float m = -FLT_MAX;
            for (int c = 0; c < cols; c++) m = mask[c] && s[c] > m ? s[c] : m;
            float sum = 0.f;
            for (int c = 0; c < cols; c++) {
                const float e = expf(fminf(s[c] - m, 0.f));  /* a padding column's score may lie above m */
                s[c] = mask[c] ? e : 0.f;
                sum += s[c];
            }
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            for (int c = 0; c < cols; c++) s[c] *= inv;
        }
        if (dim % VW == 0 && dim <= MAX_DIM) {
            weighted_values_vec(&vb, &vn, mask, scores, og, group, cols, dim);
            continue;
        }
        memset(og, 0, sizeof(float) * (size_t)group * (size_t)dim);
        for (int c = 0; c < cols; c++) {
            prefetch_row(at(&vn, c), dim);
            if (!mask[c]) continue;
            const float *restrict vc = at(&vb, c);
            for (int h = 0; h < group; h++) {
                const float p = scores[(long)h * cols + c];
                float *restrict oh = og + (long)h * dim;
                for (int d = 0; d < dim; d++) oh[d] += p * vc[d];
            }
        }
    }
    free(scores);
    return 0;
}

/* `qpr` queries per row (1 for a decode step; a prefill's tokens per row): q and out hold rows * qpr
 * query rows, row r's token i at r * qpr + i, attending to the row's columns up to cols - qpr + i.
 * 0: done; 1: out of memory. OpenMP: linked against the process's libgomp.so.1, which is the one
 * torch loaded, so the step's matrix multiplies and this share one thread pool (threads of two
 * pools would spin against each other on the same cores). */
int decode_attend(const float *q, const float *k, const float *v, const unsigned char *mask, const int *shared,
                  float *out, long ks0, long ks1, long ks2, long vs0, long vs1, long vs2,
                  int rows, int heads, int kv_heads, int cols, int dim, float scale, int threads, int qpr) {
    if (qpr < 1) qpr = 1;
    const int tasks = rows * qpr * kv_heads;
    if (threads < 1) threads = 1;
    if (threads > tasks) threads = tasks > 0 ? tasks : 1;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        const int n = omp_get_num_threads(), i = omp_get_thread_num();
        job_t j = {.q = q, .k = k, .v = v, .mask = mask, .shared = shared, .out = out, .ks0 = ks0, .ks1 = ks1,
                   .ks2 = ks2, .vs0 = vs0, .vs1 = vs1, .vs2 = vs2, .rows = rows, .heads = heads, .kv_heads = kv_heads,
                   .cols = cols, .dim = dim, .first = (int)((long)tasks * i / n), .last = (int)((long)tasks * (i + 1) / n),
                   .qpr = qpr, .scale = scale, .failed = 0};
        failed |= run_tasks(&j);
    }
    return failed;
}

/* out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps); x, out [rows, dim] contiguous (out may be x) */
void rms_norm(const float *x, const float *w, float *out, int rows, int dim, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (long)r * dim;
        float ss = 0.f;
        for (int d = 0; d < dim; d++) ss += xr[d] * xr[d];
        const float inv = 1.f / sqrtf(ss / (float)dim + eps);
        float *or_ = out + (long)r * dim;
        for (int d = 0; d < dim; d++) or_[d] = w[d] * (xr[d] * inv);
    }
}

/* x[r, h] = x[r, h] * cos[r] + rotate_half(x[r, h]) * sin[r], rotate_half(x) = (-x[half:], x[:half]);
 * x [rows, heads, dim] with row stride `row_stride` (elements), heads contiguous; cos, sin [rows, dim] */
void rope(float *x, const float *cos_, const float *sin_, int rows, int heads, int dim, long row_stride) {
    const int half = dim / 2;
    for (int r = 0; r < rows; r++) {
        const float *restrict c = cos_ + (long)r * dim, *restrict s = sin_ + (long)r * dim;
        for (int h = 0; h < heads; h++) {
            float *restrict xh = x + r * row_stride + (long)h * dim;
            for (int d = 0; d < half; d++) {
                const float a = xh[d], b = xh[d + half];
                xh[d] = a * c[d] - b * s[d];
                xh[d + half] = b * c[d + half] + a * s[d + half];
            }
        }
    }
}

/* gate = silu(gate) * up over n elements */
void silu_mul(float *gate, const float *up, long n) {
    float *restrict g = gate;
    const float *restrict u = up;
    for (long i = 0; i < n; i++) g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

/* One draw per row from softmax(x[r]) by inverse CDF at u[r] of the row's total (the first token
 * whose cumulative weight passes it), and that token's log-probability x[r][t] - logsumexp(x[r]).
 * x [rows, vocab] contiguous (the scaled logits; -inf allowed where a token is banned); weights
 * exp(x - max) are summed by blocks of BLOCK in double, as torch's cumsum accumulates, so the walk
 * finds the block first, then the token inside it. Rows are split over `threads` OpenMP threads;
 * `scratch` holds threads * vocab floats. */
void sample_rows(const float *x, const float *u, int rows, int vocab, long *tokens, float *logprobs,
                 float *scratch, int threads) {
    enum { BLOCK = 256 };
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *restrict xr = x + (long)r * vocab;
        float *restrict e = scratch + (long)omp_get_thread_num() * vocab;
        float m = -FLT_MAX;
        for (int i = 0; i < vocab; i++) m = xr[i] > m ? xr[i] : m;
        double total = 0.0;
        for (int b = 0; b < vocab; b += BLOCK) {
            const int end = b + BLOCK < vocab ? b + BLOCK : vocab;
            float part = 0.f;
            for (int i = b; i < end; i++) {
                e[i] = xr[i] > -FLT_MAX ? expf(xr[i] - m) : 0.f;
                part += e[i];
            }
            total += part;
        }
        const double target = (double)u[r] * total;
        double acc = 0.0;
        int pick = vocab - 1;
        for (int b = 0; b < vocab; b += BLOCK) {
            const int end = b + BLOCK < vocab ? b + BLOCK : vocab;
            float part = 0.f;
            for (int i = b; i < end; i++) part += e[i];
            if (acc + part <= target) { acc += part; continue; }
            for (int i = b; i < end; i++) {
                acc += e[i];
                if (acc > target) { pick = i; break; }
            }
            break;
        }
        while (pick > 0 && e[pick] == 0.f) pick--;  /* never a zero-weight token (a banned one, or rounding past the end) */
        tokens[r] = pick;
        const float lp = xr[pick] - m - (float)log(total);
        logprobs[r] = lp > -FLT_MAX ? lp : -FLT_MAX;
    }
}

/* ---- decode_layers ------------------------------------------------------------------------------ */

/* Fortran BLAS sgemm (column-major, 32-bit integers): the one in the process's libtorch_cpu (MKL) */
typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *, const float *,
                         const float *, const int *, const float *, const int *, const float *, float *, const int *);

/* one layer's parameters and its cache view; a bias pointer is NULL where the module has none */
typedef struct {
    const float *ln1, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *ln2, *wg, *bg, *wu, *bu, *wd, *bd;
    float *k, *v;              /* the cache view's first element: [rows, kv_heads, cols, dim] strided */
    long ks0, ks1, ks2, vs0, vs1, vs2;
    float eps1, eps2;
} layer_t;

/* y[rows, out] = x[rows, in] @ w[out, in]^T (+ b) (beta 0), or y += that (beta 1): nn.Linear's layout,
 * row-major, as torch.mm(x, w.t()) calls the same sgemm; x's rows `ldx` floats apart */
static void linear_ld(sgemm_fn sgemm, const float *x, int ldx, const float *w, const float *b, float *y, int rows,
                      int in, int out, float beta) {
    const float one = 1.f;
    sgemm("T", "N", &out, &rows, &in, &one, w, &in, x, &ldx, &beta, y, &out);
    if (b)
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < out; o++) y[(long)r * out + o] += b[o];
}

static void linear(sgemm_fn sgemm, const float *x, const float *w, const float *b, float *y, int rows, int in,
                   int out, float beta) {
    linear_ld(sgemm, x, in, w, b, y, rows, in, out, beta);
}

/* The step for `rows` rows of `tokens` new tokens each (1 for a decode step; a prefill's, left-padded)
 * whose residual stream `h` [rows * tokens, hidden] holds the fed tokens' embeddings (row r's token i
 * at r * tokens + i): every layer, then the final norm (`norm`, `norm_eps`) and the head (`head`
 * [vocab, hidden], `head_b`) of each row's last token into `logits` [rows, vocab]. The new keys and
 * values are written at columns `col` .. col + tokens - 1 of each layer's view (the caller made room
 * for them); attention runs over its first `cols` columns (`mask` [rows, cols], a token up to its own
 * column; `shared` as decode_attend's). All row counts below are rows * tokens. `x` [rows, hidden], `q`/`o` [rows, heads * dim], `k`/`v` [rows, kv_heads * dim] and
 * `gate`/`up` [rows, inter] are scratch. 0: done; 1: out of memory. */
int decode_layers(sgemm_fn sgemm, const layer_t *layers, int n_layers, float *h, float *x, float *q, float *k,
                  float *v, float *o, float *gate, float *up, const float *cos_, const float *sin_,
                  const unsigned char *mask, const int *shared, const float *norm, float norm_eps, const float *head, const float *head_b,
                  float *logits, int rows, int hidden, int heads, int kv_heads, int dim, int inter, int vocab,
                  int cols, int col, float scale, int threads, int tokens) {
    const int qw = heads * dim, kw = kv_heads * dim, fed = rows * (tokens > 0 ? tokens : 1);
    if (tokens < 1) tokens = 1;
    for (int l = 0; l < n_layers; l++) {
        const layer_t *L = layers + l;
        rms_norm(h, L->ln1, x, fed, hidden, L->eps1);
        linear(sgemm, x, L->wq, L->bq, q, fed, hidden, qw, 0.f);
        linear(sgemm, x, L->wk, L->bk, k, fed, hidden, kw, 0.f);
        linear(sgemm, x, L->wv, L->bv, v, fed, hidden, kw, 0.f);
        rope(q, cos_, sin_, fed, heads, dim, qw);
        rope(k, cos_, sin_, fed, kv_heads, dim, kw);
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < tokens; i++)
                for (int g = 0; g < kv_heads; g++) {
                    const long src = ((long)r * tokens + i) * kw + (long)g * dim, c = col + i;
                    memcpy(L->k + r * L->ks0 + g * L->ks1 + c * L->ks2, k + src, sizeof(float) * dim);
                    memcpy(L->v + r * L->vs0 + g * L->vs1 + c * L->vs2, v + src, sizeof(float) * dim);
                }
        if (decode_attend(q, L->k, L->v, mask, shared, o, L->ks0, L->ks1, L->ks2, L->vs0, L->vs1, L->vs2, rows, heads, kv_heads,
                          cols, dim, scale, threads, tokens))
            return 1;
        linear(sgemm, o, L->wo, L->bo, h, fed, qw, hidden, 1.f);
        rms_norm(h, L->ln2, x, fed, hidden, L->eps2);
        linear(sgemm, x, L->wg, L->bg, gate, fed, hidden, inter, 0.f);
        linear(sgemm, x, L->wu, L->bu, up, fed, hidden, inter, 0.f);
        silu_mul(gate, up, (long)fed * inter);
        linear(sgemm, gate, L->wd, L->bd, h, fed, inter, hidden, 1.f);
    }
    rms_norm(h, norm, x, fed, hidden, norm_eps);
    /* each row's last token: rows `tokens` apart in x */
    linear_ld(sgemm, x + (long)(tokens - 1) * hidden, tokens * hidden, head, head_b, logits, rows, hidden, vocab, 0.f);
    return 0;
}
