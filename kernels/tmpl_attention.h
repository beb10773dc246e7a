/* Flash attention for one (batch item, query tile). Template: see instances.h.
 *
 * The query tile (up to bq rows, pre-scaled by log2(e)/sqrt(d_k) so exp becomes exp2) is packed
 * once; the keys are visited in tiles of bk: K^T is packed so keys are the SIMD axis, S = Q K^T
 * comes from 6 x (2 vectors) register blocks, an online softmax keeps each row's running max m
 * and sum l and rescales the accumulator, and P V goes through the same register blocking.
 * The Sq x Sk score matrix never exists; scratch per thread is O(bq * bk + bk * d).
 *
 * Masked scores are replaced by -1e9 (the reference's rule). Tiles that are entirely masked, and
 * key tiles past the causal diagonal, are skipped: their keys would each weigh exp(-1e9 - m),
 * exactly 0 unless the row's final max m is itself near -1e9 (a fully masked row, or absurd
 * scores). Such rare rows are recomputed exactly over all keys by exact_row. */
#include "tmpl_simd.h"
#define SA_NR (2 * SA_VL)  /* key (or d_v) columns per register block */

/* s[r][0:NR] = sum_p qp[r][p] * kt[p][0:NR], r < 6 */
static inline void SA_FN(qk_block)(const SA_T *restrict qp, int64_t dk, const SA_T *restrict kt,
                                   int64_t ldk, SA_T *restrict s, int64_t lds) {
    VEC c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    VEC c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    for (int64_t p = 0; p < dk; p++) {
        VEC b0 = LOAD(kt + p * ldk), b1 = LOAD(kt + p * ldk + SA_VL);
        SA_T a;
        a = qp[p];          c00 += a * b0; c01 += a * b1;
        a = qp[dk + p];     c10 += a * b0; c11 += a * b1;
        a = qp[2 * dk + p]; c20 += a * b0; c21 += a * b1;
        a = qp[3 * dk + p]; c30 += a * b0; c31 += a * b1;
        a = qp[4 * dk + p]; c40 += a * b0; c41 += a * b1;
        a = qp[5 * dk + p]; c50 += a * b0; c51 += a * b1;
    }
    STORE(s, c00);           STORE(s + SA_VL, c01);
    STORE(s + lds, c10);     STORE(s + lds + SA_VL, c11);
    STORE(s + 2 * lds, c20); STORE(s + 2 * lds + SA_VL, c21);
    STORE(s + 3 * lds, c30); STORE(s + 3 * lds + SA_VL, c31);
    STORE(s + 4 * lds, c40); STORE(s + 4 * lds + SA_VL, c41);
    STORE(s + 5 * lds, c50); STORE(s + 5 * lds + SA_VL, c51);
}

/* acc[r][0:NR] += sum_{j < nk} p[r][j] * v[j][0:NR], r < 6 */
static inline void SA_FN(pv_block)(const SA_T *restrict p, int64_t ldp, int64_t nk, const SA_T *restrict v,
                                   int64_t ldv, SA_T *restrict acc, int64_t lda) {
    VEC c00 = LOAD(acc), c01 = LOAD(acc + SA_VL);
    VEC c10 = LOAD(acc + lda), c11 = LOAD(acc + lda + SA_VL);
    VEC c20 = LOAD(acc + 2 * lda), c21 = LOAD(acc + 2 * lda + SA_VL);
    VEC c30 = LOAD(acc + 3 * lda), c31 = LOAD(acc + 3 * lda + SA_VL);
    VEC c40 = LOAD(acc + 4 * lda), c41 = LOAD(acc + 4 * lda + SA_VL);
    VEC c50 = LOAD(acc + 5 * lda), c51 = LOAD(acc + 5 * lda + SA_VL);
    for (int64_t j = 0; j < nk; j++) {
        VEC b0 = LOAD(v + j * ldv), b1 = LOAD(v + j * ldv + SA_VL);
        SA_T a;
        a = p[j];           c00 += a * b0; c01 += a * b1;
        a = p[ldp + j];     c10 += a * b0; c11 += a * b1;
        a = p[2 * ldp + j]; c20 += a * b0; c21 += a * b1;
        a = p[3 * ldp + j]; c30 += a * b0; c31 += a * b1;
        a = p[4 * ldp + j]; c40 += a * b0; c41 += a * b1;
        a = p[5 * ldp + j]; c50 += a * b0; c51 += a * b1;
    }
    STORE(acc, c00);           STORE(acc + SA_VL, c01);
    STORE(acc + lda, c10);     STORE(acc + lda + SA_VL, c11);
    STORE(acc + 2 * lda, c20); STORE(acc + 2 * lda + SA_VL, c21);
    STORE(acc + 3 * lda, c30); STORE(acc + 3 * lda + SA_VL, c31);
    STORE(acc + 4 * lda, c40); STORE(acc + 4 * lda + SA_VL, c41);
    STORE(acc + 5 * lda, c50); STORE(acc + 5 * lda + SA_VL, c51);
}

/* One query row straight from the definition, in the natural (not log2) domain: the rare rows
 * whose max is near the masked score, where skipped keys do count (e.g. a fully masked row). */
static void SA_FN(exact_row)(const sa_attn_args *a, int64_t b, int64_t i, SA_T *restrict out) {
    const SA_T *q = (const SA_T *)a->q + a->offsets[4 * b] + i * a->rs[0];
    const SA_T *k = (const SA_T *)a->k + a->offsets[4 * b + 1];
    const SA_T *v = (const SA_T *)a->v + a->offsets[4 * b + 2];
    const uint8_t *mrow = a->masked ? a->mask + a->offsets[4 * b + 3] + i * a->rs[3] : NULL;
    const SA_T scale = (SA_T)sqrt((double)a->dk);
    SA_T m = -INFINITY, sum = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t j = 0; j < a->Sk; j++) {
            SA_T s = (SA_T)SA_MASKED;
            if (!(a->causal && j > i) && !(mrow && !mrow[j])) {
                s = 0;
                for (int64_t t = 0; t < a->dk; t++) s += q[t] * k[j * a->rs[1] + t];
                s /= scale;
            }
            if (pass == 0) {
                m = (s > m || s != s) ? s : m;  /* a NaN score makes the row NaN, as in the reference */
            } else {
                SA_T e = (SA_T)exp((double)(s - m));
                sum += e;
                for (int64_t c = 0; c < a->dv; c++) out[c] += e * v[j * a->rs[2] + c];
            }
        }
        if (pass == 0) for (int64_t c = 0; c < a->dv; c++) out[c] = 0;
    }
    for (int64_t c = 0; c < a->dv; c++) out[c] /= sum;
}

static void SA_FN(sa_attn_tile)(const sa_attn_args *a, int64_t b, int64_t q0, void *scratch) {
    const int64_t dk = a->dk, dv = a->dv, bk = a->bk, rs_k = a->rs[1], rs_v = a->rs[2], rs_m = a->rs[3];
    const int64_t nq = a->bq < a->Sq - q0 ? a->bq : a->Sq - q0;
    const int64_t nqp = (nq + 5) / 6 * 6, dvp = (dv + SA_NR - 1) / SA_NR * SA_NR;
    const SA_T *q = (const SA_T *)a->q + a->offsets[4 * b] + q0 * a->rs[0];
    const SA_T *k = (const SA_T *)a->k + a->offsets[4 * b + 1];
    const SA_T *v = (const SA_T *)a->v + a->offsets[4 * b + 2];
    const uint8_t *mk = a->masked ? a->mask + a->offsets[4 * b + 3] + q0 * rs_m : NULL;
    SA_T *out = (SA_T *)a->out + (b * a->Sq + q0) * dv;
    char *cur = (char *)scratch;
    SA_T *qp = sa_carve(&cur, a->bq + 6, dk, sizeof(SA_T)), *kt = sa_carve(&cur, dk, bk, sizeof(SA_T));
    SA_T *s = sa_carve(&cur, a->bq + 6, bk, sizeof(SA_T)), *vp = sa_carve(&cur, bk, dv + 16, sizeof(SA_T));
    SA_T *acc = sa_carve(&cur, a->bq + 6, dv + 16, sizeof(SA_T));
    SA_T *m = sa_carve(&cur, a->bq + 6, 1, sizeof(SA_T)), *l = sa_carve(&cur, a->bq + 6, 1, sizeof(SA_T));
    const SA_T masked_l2 = (SA_T)(SA_MASKED * SA_LOG2E);  /* the masked score in log2 units */

    const SA_T qscale = (SA_T)(SA_LOG2E / sqrt((double)dk));
    for (int64_t r = 0; r < nqp; r++)
        for (int64_t p = 0; p < dk; p++) qp[r * dk + p] = r < nq ? q[r * a->rs[0] + p] * qscale : 0;
    for (int64_t r = 0; r < nqp; r++) { m[r] = -INFINITY; l[r] = 0; }
    memset(acc, 0, sizeof(SA_T) * nqp * dvp);

    /* causal: keys past the last row's diagonal are masked for every row of the tile */
    const int64_t kend = a->causal && q0 + nq < a->Sk ? q0 + nq : a->Sk;
    for (int64_t k0 = 0; k0 < kend; k0 += bk) {
        const int64_t nk = bk < kend - k0 ? bk : kend - k0, nkp = (nk + SA_NR - 1) / SA_NR * SA_NR;
        int partial = a->causal && k0 + nk - 1 > q0;
        if (mk) {  /* count the visible (query, key) pairs of this tile */
            int64_t ones = 0;
            for (int64_t r = 0; r < (rs_m ? nq : 1); r++)
                for (int64_t j = 0; j < nk; j++) ones += mk[r * rs_m + k0 + j];
            if (!rs_m) ones *= nq;
            if (ones == 0) continue;
            partial |= ones != nq * nk;
        }
        for (int64_t j = 0; j < nk; j++)
            for (int64_t p = 0; p < dk; p++) kt[p * bk + j] = k[(k0 + j) * rs_k + p];
        for (int64_t p = 0; p < dk; p++)
            for (int64_t j = nk; j < nkp; j++) kt[p * bk + j] = 0;
        for (int64_t jp = 0; jp < nkp; jp += SA_NR)
            for (int64_t r0 = 0; r0 < nqp; r0 += 6)
                SA_FN(qk_block)(qp + r0 * dk, dk, kt + jp, bk, s + r0 * bk + jp, bk);

        for (int64_t r = 0; r < nq; r++) {  /* online softmax over this tile's keys */
            SA_T *sr = s + r * bk;
            if (partial)
                for (int64_t j = 0; j < nk; j++)
                    if ((a->causal && k0 + j > q0 + r) || (mk && !mk[r * rs_m + k0 + j])) sr[j] = masked_l2;
            for (int64_t j = nk; j < nkp; j++) sr[j] = -INFINITY;
            VEC mv = SA_FN(splat)(-INFINITY);
            for (int64_t j = 0; j < nkp; j += SA_VL) mv = SA_FN(vmax)(LOAD(sr + j), mv);
            SA_T mt = SA_FN(hmax)(mv), mnew = mt > m[r] ? mt : m[r];
            SA_T alpha = (SA_T)exp2((double)(m[r] - mnew));
            VEC sum = SA_FN(splat)(0);
            for (int64_t j = 0; j < nkp; j += SA_VL) {
                VEC pj = SA_FN(exp2v)(LOAD(sr + j) - mnew);
                STORE(sr + j, pj);
                sum += pj;
            }
            l[r] = l[r] * alpha + SA_FN(hsum)(sum);
            m[r] = mnew;
            if (alpha != 1)
                for (int64_t c = 0; c < dvp; c += SA_VL) STORE(acc + r * dvp + c, LOAD(acc + r * dvp + c) * alpha);
        }

        const SA_T *vs = v + k0 * rs_v;
        int64_t ldv = rs_v;
        if (dv != dvp) {  /* pad d_v to whole register blocks */
            for (int64_t j = 0; j < nk; j++)
                for (int64_t c = 0; c < dvp; c++) vp[j * dvp + c] = c < dv ? vs[j * rs_v + c] : 0;
            vs = vp, ldv = dvp;
        }
        for (int64_t c = 0; c < dvp; c += SA_NR)
            for (int64_t r0 = 0; r0 < nqp; r0 += 6)
                SA_FN(pv_block)(s + r0 * bk, bk, nk, vs + c, ldv, acc + r0 * dvp + c, dvp);
    }

    for (int64_t r = 0; r < nq; r++) {
        if (m[r] < masked_l2 + 2000) {  /* the skipped keys may weigh something: be exact */
            SA_FN(exact_row)(a, b, q0 + r, out + r * dv);
            continue;
        }
        const SA_T inv = 1 / l[r];
        for (int64_t c = 0; c < dv; c++) out[r * dv + c] = acc[r * dvp + c] * inv;
    }
}
