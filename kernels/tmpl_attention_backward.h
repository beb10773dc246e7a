/* attention's backward, flash style, one K/V unit a task. Template: see instances.h.
 *
 * For each key tile of the unit (SA_BWD_K keys) and each query tile of the unit's items that can
 * see it (SA_BWD_Q queries), the weights are recomputed from the forward's lse, never kept:
 *   S = Q K^T; s = hide(softcap(scale S) + bias + ALiBi); P = exp(s - lse)
 *   dP = dO V^T; dS = scale P (dP - D) (1 - tanh^2 under a softcap), 0 where a key is hidden
 *   dV_tile += P^T dO; dK_tile += dS^T Q; dQ_rows += dS K
 * dK and dV of a key tile are summed over every query of every item of the unit (a grouped-query
 * unit's heads, broadcast K/V) in scratch and written once; dQ's rows belong to the unit's items
 * only, so no other task touches them. Memory: O((SA_BWD_Q + SA_BWD_K) d) a thread, nothing Sq x Sk.
 * A key tile outside a query tile's window (past the causal diagonal) is skipped: its keys weigh
 * exp(-1e9 - lse) = 0 and have dS = 0, unless some row of the query tile has every key hidden
 * (lse near -1e9: such a row's weights are uniform, as in the forward), in which case it is run.
 * Such a row's lse, -1e9 + ln(keys), is -1e9 once rounded to float32: its weights come from its
 * max score and log sum exp(s - max), worked out exactly at the task's start (rows_fix). */
#include "tmpl_simd.h"
#include "tmpl_attention_score.h"
#define SA_NR (2 * SA_VL)                      /* columns of a register block: two vectors */
#define SA_RB (SA_VBYTES == 64 ? 8 : 4)        /* rows of a register block (divides the tiles' 64) */
#define SA_RUP(n) (((n) + SA_NR - 1) / SA_NR * SA_NR)

/* C[r][0:n] (+)= sum_{p < np} A[r sr + p sp] B[p ldb + 0:n] for r < m: m a multiple of SA_RB, n of
 * SA_NR (the operands padded), A read one element at a time (sr, sp: a row-major A or its transpose). */
static void SA_FN(bgemm)(int64_t m, int64_t n, int64_t np, const SA_T *restrict A, int64_t sr, int64_t sp,
                         const SA_T *restrict B, int64_t ldb, SA_T *restrict C, int64_t ldc, int add) {
    for (int64_t r0 = 0; r0 < m; r0 += SA_RB)
        for (int64_t c0 = 0; c0 < n; c0 += SA_NR) {
            VEC c[SA_RB][2];
#pragma GCC unroll 8
            for (int r = 0; r < SA_RB; r++) {
                c[r][0] = add ? LOAD(C + (r0 + r) * ldc + c0) : SA_FN(splat)(0);
                c[r][1] = add ? LOAD(C + (r0 + r) * ldc + c0 + SA_VL) : SA_FN(splat)(0);
            }
            const SA_T *a = A + r0 * sr;
            for (int64_t p = 0; p < np; p++) {
                const VEC b0 = LOAD(B + p * ldb + c0), b1 = LOAD(B + p * ldb + c0 + SA_VL);
#pragma GCC unroll 8
                for (int r = 0; r < SA_RB; r++) {
                    const SA_T x = a[r * sr + p * sp];
                    c[r][0] += x * b0, c[r][1] += x * b1;
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < SA_RB; r++) {
                STORE(C + (r0 + r) * ldc + c0, c[r][0]);
                STORE(C + (r0 + r) * ldc + c0 + SA_VL, c[r][1]);
            }
        }
}

/* tanh by exp (odd, so on |x|; |x| capped where tanh is 1 in either dtype) */
static inline VEC SA_FN(btanh)(VEC x) {
    const VEC one = SA_FN(splat)(1), cap = SA_FN(splat)(20);
    VEC ax = SA_FN(vmax)(x, -x);
    ax = SA_FN(select)(ax > cap, cap, ax);
    const VEC e = SA_FN(expv)(ax * (SA_T)-2);
    const VEC t = (one - e) / (one + e);
    return SA_FN(select)(x < SA_FN(splat)(0), -t, t);
}

/* rows x cols of src (row step ld) into dst (row step ldd), zero past them up to nr x ncols */
static void SA_FN(bload)(const SA_T *src, int64_t ld, int64_t rows, int64_t cols, SA_T *dst, int64_t ldd,
                         int64_t nr, int64_t ncols) {
    for (int64_t r = 0; r < nr; r++) {
        SA_T *d = dst + r * ldd;
        const int64_t n = r < rows ? cols : 0;
        if (n) memcpy(d, src + r * ld, sizeof(SA_T) * n);
        if (ncols > n) memset(d + n, 0, sizeof(SA_T) * (ncols - n));
    }
}

/* The weights P (in s) and dS (in ds) of query rows q0 .. q0 + nq of item `it` against keys k0 ..
 * k0 + nk, from S = Q K^T in s and dP = dO V^T in ds; t: room for tanh under a softcap; hid: a mark
 * per pair, for a tile some pair of which is hidden (`partial`). */
static void SA_FN(weights)(const sa_attn_plan *a, const sa_item *it, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                           int partial, const SA_T *fix, const SA_T *D, SA_T *s, SA_T *ds, SA_T *t, uint8_t *hid) {
    const int64_t K = SA_BWD_K, pb = it->pos + q0;
    const VEC scale = SA_FN(splat)((SA_T)a->scale);
    const SA_T cap = (SA_T)a->softcap;
    for (int64_t r = 0; r < SA_BWD_Q; r++) {
        SA_T *sr = s + r * K, *tr = t + r * K;
        if (cap > 0) {
            for (int64_t j = 0; j < K; j += SA_VL) {
                const VEC th = SA_FN(btanh)(LOAD(sr + j) * scale / cap);
                STORE(tr + j, th), STORE(sr + j, th * cap);
            }
        } else {
            for (int64_t j = 0; j < K; j += SA_VL) STORE(sr + j, LOAD(sr + j) * scale);
        }
        if (r >= nq) continue;
        if (a->has_bias) {
            const SA_T *bias = (const SA_T *)a->bias + it->bias + (q0 + r) * a->rs_bias + k0;
            for (int64_t j = 0; j < nk; j++) sr[j] += bias[j];
        }
        if (a->has_alibi) {
            const SA_T slope = -(SA_T)it->slope;
            for (int64_t j = 0; j < nk; j++) {
                const int64_t dist = pb + r - k0 - j;
                sr[j] += slope * (SA_T)(dist < 0 ? -dist : dist);
            }
        }
        if (partial) {  /* hidden pairs: the window, the mask, the keys past the tile's */
            const uint8_t *mrow = a->has_mask ? a->mask + it->mask + (q0 + r) * a->rs_mask + k0 : NULL;
            uint8_t *hr = hid + r * K;
            for (int64_t j = 0; j < K; j++) {
                const int64_t key = k0 + j;
                hr[j] = j >= nk || key < pb + r - a->left || key > pb + r + a->right || (mrow && !mrow[j]);
                if (hr[j]) sr[j] = (SA_T)SA_MASKED;
            }
        }
    }
    for (int64_t r = 0; r < SA_BWD_Q; r++) {
        SA_T *sr = s + r * K, *dr = ds + r * K, *tr = t + r * K;
        const VEC l = SA_FN(splat)(r < nq ? fix[2 * r] : (SA_T)INFINITY), d = SA_FN(splat)(r < nq ? D[r] : 0);
        const VEC rel = SA_FN(splat)(r < nq ? fix[2 * r + 1] : 0);
        for (int64_t j = 0; j < K; j += SA_VL) {
            const VEC p = SA_FN(expv)((LOAD(sr + j) - l) - rel);
            VEC g = p * (LOAD(dr + j) - d) * scale;
            if (cap > 0) {
                const VEC th = LOAD(tr + j);
                g *= SA_FN(splat)(1) - th * th;
            }
            STORE(sr + j, p), STORE(dr + j, g);
        }
        if (partial && r < nq)
            for (int64_t j = 0; j < K; j++) if (hid[r * K + j]) dr[j] = 0;
        if (r >= nq)
            for (int64_t j = 0; j < K; j++) sr[j] = 0, dr[j] = 0;
    }
}

/* (base, rel) of every row of the unit's items (b->fix): (lse, 0), or for a row whose lse is below
 * SA_MASKED + SA_EXACT_MARGIN, its max score m and ln sum_j exp(s_j - m) over all its keys in double. */
static void SA_FN(rows_fix)(const sa_attn_plan *a, const sa_attn_back *b, int64_t u) {
    const SA_T exact_below = (SA_T)(SA_MASKED + SA_EXACT_MARGIN);
    const sa_unit *un = a->units + u;
    for (int64_t e = b->first[u]; e < b->first[u + 1]; e++) {
        const sa_item *it = a->items + b->items[e];
        for (int64_t i = 0; i < it->sq; i++) {
            const int64_t row = it->out / a->dv + i;
            SA_T *fix = (SA_T *)b->fix + 2 * row;
            fix[0] = ((const SA_T *)b->lse)[row], fix[1] = 0;
            if (fix[0] >= exact_below) continue;
            const SA_T *q = (const SA_T *)a->q + it->q + i * a->rs_q;
            const uint8_t *mrow = a->has_mask ? a->mask + it->mask + i * a->rs_mask : NULL;
            double m = -INFINITY, sum = 0;
            for (int pass = 0; pass < 2; pass++)
                for (int64_t j = 0; j < un->sk; j++) {
                    const SA_T *k = (const SA_T *)a->k + un->k + j * a->rs_k;
                    SA_T dot = 0;
                    for (int64_t c = 0; c < a->dk; c++) dot += q[c] * k[c];
                    SA_T s = SA_FN(score)(a, it, i, j, dot);
                    if (!SA_FN(in_window)(a, it->pos + i, j) || (mrow && !mrow[j])) s = (SA_T)SA_MASKED;
                    if (pass == 0) m = s > m ? s : m;
                    else sum += exp((double)s - m);
                }
            fix[0] = (SA_T)m, fix[1] = (SA_T)log(sum);
        }
    }
}

static void SA_FN(sa_attn_back_unit)(const sa_attn_plan *a, const sa_attn_back *b, int64_t u, void *scratch) {
    const sa_unit *un = a->units + u;
    const int64_t dk = a->dk, dv = a->dv, dkp = SA_RUP(dk), dvp = SA_RUP(dv), Q = SA_BWD_Q, K = SA_BWD_K;
    const SA_T *k = (const SA_T *)a->k + un->k, *v = (const SA_T *)a->v + un->v;
    SA_T *dK = (SA_T *)b->dk + un->k, *dV = (SA_T *)b->dv + un->v;
    const SA_T exact_below = (SA_T)(SA_MASKED + SA_EXACT_MARGIN);
    char *cur = (char *)scratch;
    SA_T *kt = sa_carve(&cur, dk, K, sizeof(SA_T)), *vt = sa_carve(&cur, dv, K, sizeof(SA_T));
    SA_T *kr = sa_carve(&cur, K, dkp, sizeof(SA_T)), *dka = sa_carve(&cur, K, dkp, sizeof(SA_T));
    SA_T *dva = sa_carve(&cur, K, dvp, sizeof(SA_T)), *qr = sa_carve(&cur, Q, dkp, sizeof(SA_T));
    SA_T *dor = sa_carve(&cur, Q, dvp, sizeof(SA_T)), *dqt = sa_carve(&cur, Q, dkp, sizeof(SA_T));
    SA_T *s = sa_carve(&cur, Q, K, sizeof(SA_T)), *ds = sa_carve(&cur, Q, K, sizeof(SA_T));
    SA_T *t = sa_carve(&cur, Q, K, sizeof(SA_T));
    uint8_t *hid = (uint8_t *)sa_carve(&cur, Q, K, 1);
    SA_T *lt = sa_carve(&cur, 2, Q, sizeof(SA_T)), *Dt = sa_carve(&cur, 1, Q, sizeof(SA_T));

    SA_FN(rows_fix)(a, b, u);

    for (int64_t k0 = 0; k0 < un->sk; k0 += K) {
        const int64_t nk = un->sk - k0 < K ? un->sk - k0 : K;
        for (int64_t c = 0; c < dk; c++)
            for (int64_t j = 0; j < K; j++) kt[c * K + j] = j < nk ? k[(k0 + j) * a->rs_k + c] : 0;
        for (int64_t c = 0; c < dv; c++)
            for (int64_t j = 0; j < K; j++) vt[c * K + j] = j < nk ? v[(k0 + j) * a->rs_v + c] : 0;
        SA_FN(bload)(k + k0 * a->rs_k, a->rs_k, nk, dk, kr, dkp, K, dkp);
        memset(dka, 0, sizeof(SA_T) * K * dkp), memset(dva, 0, sizeof(SA_T) * K * dvp);
        for (int64_t e = b->first[u]; e < b->first[u + 1]; e++) {
            const sa_item *it = a->items + b->items[e];
            const int64_t row0 = it->out / dv;  /* the item's first row of dout, D and lse */
            for (int64_t q0 = 0; q0 < it->sq; q0 += Q) {
                const int64_t nq = it->sq - q0 < Q ? it->sq - q0 : Q, pb = it->pos + q0;
                int any_hidden_row = 0;
                for (int64_t r = 0; r < nq; r++) {
                    const SA_T *fix = (const SA_T *)b->fix + 2 * (row0 + q0 + r);
                    lt[2 * r] = fix[0], lt[2 * r + 1] = fix[1], Dt[r] = ((const SA_T *)b->d)[row0 + q0 + r];
                    any_hidden_row |= !(((const SA_T *)b->lse)[row0 + q0 + r] >= exact_below);
                }
                /* the keys some row of the tile sees: pb - left .. pb + nq - 1 + right */
                const int seen = k0 + nk - 1 >= pb - a->left && k0 <= pb + nq - 1 + a->right;
                if (!seen && !any_hidden_row) continue;
                const int partial = a->has_mask || nk < K || k0 < pb + nq - 1 - a->left || k0 + nk - 1 > pb + a->right;
                SA_FN(bload)((const SA_T *)a->q + it->q + q0 * a->rs_q, a->rs_q, nq, dk, qr, dkp, Q, dkp);
                SA_FN(bload)((const SA_T *)b->dout + (row0 + q0) * dv, dv, nq, dv, dor, dvp, Q, dvp);
                SA_FN(bgemm)(Q, K, dk, qr, dkp, 1, kt, K, s, K, 0);    /* S = Q K^T */
                SA_FN(bgemm)(Q, K, dv, dor, dvp, 1, vt, K, ds, K, 0);  /* dP = dO V^T */
                SA_FN(weights)(a, it, q0, nq, k0, nk, partial, lt, Dt, s, ds, t, hid);
                SA_FN(bgemm)(K, dvp, Q, s, 1, K, dor, dvp, dva, dvp, 1);  /* dV += P^T dO */
                SA_FN(bgemm)(K, dkp, Q, ds, 1, K, qr, dkp, dka, dkp, 1);  /* dK += dS^T Q */
                SA_FN(bgemm)(Q, dkp, K, ds, K, 1, kr, dkp, dqt, dkp, 0);  /* dQ = dS K */
                SA_T *dq = (SA_T *)b->dq + it->q + q0 * a->rs_q;
                for (int64_t r = 0; r < nq; r++)
                    for (int64_t c = 0; c < dk; c++) dq[r * a->rs_q + c] += dqt[r * dkp + c];
            }
        }
        for (int64_t j = 0; j < nk; j++) {
            for (int64_t c = 0; c < dk; c++) dK[(k0 + j) * a->rs_k + c] = dka[j * dkp + c];
            for (int64_t c = 0; c < dv; c++) dV[(k0 + j) * a->rs_v + c] = dva[j * dvp + c];
        }
    }
}
#undef SA_NR
#undef SA_RB
#undef SA_RUP
