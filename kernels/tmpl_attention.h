/* Flash attention for one (batch item, query tile). Template: see instances.h.
 *
 * Scores are kept transposed, st[key][query], so queries are the SIMD axis: the query tile (up to
 * bq rows, pre-scaled by log2(e)/sqrt(d_k) so exp becomes exp2) is packed once as Q^T, keys are
 * read straight from K (no per-tile transpose), and the online softmax over keys is vertical
 * vector work (running max m and sum l per query, no horizontal reductions). Key tiles of bk:
 * S^T = K Q^T from SA_BR-key x (2 vectors of queries) register blocks, then O += P V from SA_BR-query x
 * (2 vectors of d_v) blocks. The Sq x Sk score matrix never exists: scratch is O((bq + d) * bk).
 *
 * With softcap, a bias or ALiBi, Q is scaled by the scale alone and a pass over the tile
 * (transform_tile) applies them in natural units before the change to log2 units. Hidden scores
 * (mask, or outside the window p - left <= j <= p + right, causal included) are replaced by -1e9
 * (the reference's rule). Tiles that are entirely masked, and key tiles outside every row's window
 * (past the causal diagonal, before a sliding window), are skipped: their keys would each weigh
 * exp(-1e9 - m), exactly 0 unless the row's final max m is itself near -1e9 (a fully hidden row, or
 * absurd scores). Such rare rows are recomputed exactly over all keys by exact_row. */
#include "tmpl_simd.h"
#define SA_NR (2 * SA_VL)  /* columns per register block: queries of S^T, or d_v columns of O */
#define SA_BR SA_BR_OF(SA_VBYTES)  /* rows per register block in this copy (attention.h says why) */

/* st[j][0:NR] = sum_p k[j][p] * qt[p][0:NR] for the SA_BR keys j at k, k + ldk, ... */
static inline __attribute__((always_inline)) void SA_FN(qk_block)(const SA_T *restrict k, int64_t ldk, int64_t dk, const SA_T *restrict qt,
                                   int64_t ldq, SA_T *restrict st, int64_t lds) {
    VEC c0[SA_BR], c1[SA_BR];
#pragma GCC unroll 16
    for (int r = 0; r < SA_BR; r++) c0[r] = c1[r] = SA_FN(splat)(0);
    for (int64_t p = 0; p < dk; p++) {
        const VEC b0 = LOAD(qt + p * ldq), b1 = LOAD(qt + p * ldq + SA_VL);
#pragma GCC unroll 16
        for (int r = 0; r < SA_BR; r++) {
            const SA_T a = k[r * ldk + p];
            c0[r] += a * b0, c1[r] += a * b1;
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < SA_BR; r++) STORE(st + r * lds, c0[r]), STORE(st + r * lds + SA_VL, c1[r]);
}

/* acc[r][0:NR] += sum_{j < nk} pt[j][r] * v[j][0:NR] for the SA_BR queries r */
static inline __attribute__((always_inline)) void SA_FN(pv_block)(const SA_T *restrict pt, int64_t ldp, int64_t nk, const SA_T *restrict v,
                                   int64_t ldv, SA_T *restrict acc, int64_t lda) {
    VEC c0[SA_BR], c1[SA_BR];
#pragma GCC unroll 16
    for (int r = 0; r < SA_BR; r++) c0[r] = LOAD(acc + r * lda), c1[r] = LOAD(acc + r * lda + SA_VL);
    for (int64_t j = 0; j < nk; j++) {
        const VEC b0 = LOAD(v + j * ldv), b1 = LOAD(v + j * ldv + SA_VL);
        const SA_T *p = pt + j * ldp;
#pragma GCC unroll 16
        for (int r = 0; r < SA_BR; r++) {
            const SA_T a = p[r];
            c0[r] += a * b0, c1[r] += a * b1;
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < SA_BR; r++) STORE(acc + r * lda, c0[r]), STORE(acc + r * lda + SA_VL, c1[r]);
}

#define SA_ABS(x) ((x) < 0 ? -(x) : (x))

#include "tmpl_attention_score.h"

/* lse of row i of item `it` (a->lse set) from the online softmax's max m and sum l in log2 units
 * (l = sum_j 2^(s_j - m)): ln 2 m + ln l, in double before the rounding to the dtype */
static inline void SA_FN(put_lse)(const sa_attn_plan *a, const sa_item *it, int64_t i, SA_T m, SA_T l) {
    ((SA_T *)a->lse)[it->out / a->dv + i] = (SA_T)(0.6931471805599453 * (double)m + log((double)l));
}

/* One query row straight from the definition, in the natural (not log2) domain, over all the
 * item's keys: the rare rows whose max is within SA_EXACT_MARGIN of the masked score (see
 * attention.h), e.g. a row whose every key is hidden (mean(V)). */
static void SA_FN(exact_row)(const sa_attn_plan *a, const sa_item *it, int64_t i, SA_T *restrict out) {
    SA_T *lse = a->lse ? (SA_T *)a->lse + it->out / a->dv + i : NULL;
    const SA_T *q = (const SA_T *)a->q + it->q + i * a->rs_q;
    const uint8_t *mrow = a->has_mask ? a->mask + it->mask + i * a->rs_mask : NULL;
    const int64_t p = it->pos + i;
    SA_T m = -INFINITY, sum = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t j = 0; j < it->sk; j++) {
            int64_t kv[2];
            sa_key_base(a, it->k, it->v, j, kv);
            const SA_T *k = (const SA_T *)a->k + kv[0] + j * a->rs_k, *v = (const SA_T *)a->v + kv[1] + j * a->rs_v;
            SA_T dot = 0;
            for (int64_t t = 0; t < a->dk; t++) dot += q[t] * k[t];
            SA_T s = SA_FN(score)(a, it, i, j, dot);
            if (!SA_FN(in_window)(a, p, j) || (mrow && !mrow[j])) s = (SA_T)SA_MASKED;
            if (pass == 0) {
                m = (s > m || s != s) ? s : m;  /* a NaN score makes the row NaN, as in the reference */
            } else {
                SA_T e = (SA_T)exp((double)(s - m));
                sum += e;
                for (int64_t c = 0; c < a->dv; c++) out[c] += e * v[c];
            }
        }
        if (pass == 0) for (int64_t c = 0; c < a->dv; c++) out[c] = 0;
    }
    for (int64_t c = 0; c < a->dv; c++) out[c] /= sum;
    if (lse) *lse = (SA_T)((double)m + log((double)sum));
}

/* tanh by exp2 (odd, so on |x|; |x| capped where tanh is 1 in either dtype) */
static inline VEC SA_FN(tanhv)(VEC x) {
    const VEC one = SA_FN(splat)(1), cap = SA_FN(splat)(20);
    VEC ax = SA_FN(vmax)(x, -x);
    ax = SA_FN(select)(ax > cap, cap, ax);  /* a NaN fails the compare and stays NaN */
    const VEC e = SA_FN(exp2v)(ax * (SA_T)(-2 * SA_LOG2E));
    const VEC t = (one - e) / (one + e);
    return SA_FN(select)(x < SA_FN(splat)(0), -t, t);
}

/* The natural-units pass of a tile (softcap, bias, ALiBi) over st[j][0:nqv] for keys k0 + j of
 * the queries at positions pb + r, then the change to log2 units the online softmax works in. */
static void SA_FN(transform_tile)(const sa_attn_plan *a, const sa_item *it, int64_t q0, int64_t nq, int64_t nqv,
                                  int64_t k0, int64_t nk, SA_T *restrict st, int64_t ldq) {
    const SA_T log2e = (SA_T)SA_LOG2E;
    if (a->softcap > 0) {
        const VEC c = SA_FN(splat)((SA_T)a->softcap), inv = SA_FN(splat)((SA_T)(1 / a->softcap));
        for (int64_t j = 0; j < nk; j++)
            for (int64_t r = 0; r < nqv; r += SA_VL)
                STORE(st + j * ldq + r, c * SA_FN(tanhv)(LOAD(st + j * ldq + r) * inv));
    }
    if (a->has_bias) {  /* bias rows run over keys, S^T over queries: read rows, write columns */
        const SA_T *bias = (const SA_T *)a->bias + it->bias + q0 * a->rs_bias + k0;
        for (int64_t r = 0; r < nq; r++)
            for (int64_t j = 0; j < nk; j++) st[j * ldq + r] += bias[r * a->rs_bias + j];
    }
    if (a->has_alibi) {
        const SA_T slope = -(SA_T)it->slope;
        for (int64_t j = 0; j < nk; j++) {
            const SA_T d0 = (SA_T)(it->pos + q0 - k0 - j);  /* p_r - key = d0 + r */
            SA_T *row = st + j * ldq;
            for (int64_t r = 0; r < nqv; r++) row[r] += slope * SA_ABS(d0 + (SA_T)r);
        }
    }
    for (int64_t j = 0; j < nk; j++)
        for (int64_t r = 0; r < nqv; r += SA_VL) STORE(st + j * ldq + r, LOAD(st + j * ldq + r) * log2e);
}

static void SA_FN(sa_attn_tile)(const sa_attn_plan *a, const sa_task *task, void *scratch) {
    const sa_item *it = a->items + task->item;
    const int64_t dk = a->dk, dv = a->dv, bk = a->bk, rs_k = a->rs_k, rs_v = a->rs_v, rs_m = a->rs_mask;
    const int64_t q0 = task->q0, nq = task->rows, Sk = it->sk;
    const int64_t nqv = (nq + SA_NR - 1) / SA_NR * SA_NR;  /* query columns of S^T computed */
    const int64_t nqr = (nq + SA_BR - 1) / SA_BR * SA_BR;  /* query rows of the P V blocks */
    const int64_t ldq = a->bq + SA_COL_PAD, dvp = (dv + SA_NR - 1) / SA_NR * SA_NR;
    const int64_t pb = it->pos + q0;                       /* query r of the tile sits at pb + r */
    const int transform = sa_transforms(a);
    const SA_T *q = (const SA_T *)a->q + it->q + q0 * a->rs_q;
    const SA_T *k = (const SA_T *)a->k + it->k;
    const SA_T *v = (const SA_T *)a->v + it->v;
    const uint8_t *mk = a->has_mask ? a->mask + it->mask + q0 * rs_m : NULL;
    SA_T *out = (SA_T *)a->out + it->out + q0 * dv;
    char *cur = (char *)scratch;
    SA_T *qt = sa_carve(&cur, dk, ldq, sizeof(SA_T)), *st = sa_carve(&cur, bk + SA_BR_MAX, ldq, sizeof(SA_T));
    SA_T *kpad = sa_carve(&cur, SA_BR_MAX, dk, sizeof(SA_T)), *vp = sa_carve(&cur, bk, dv + SA_COL_PAD, sizeof(SA_T));
    SA_T *acc = sa_carve(&cur, a->bq + SA_BR_MAX, dv + SA_COL_PAD, sizeof(SA_T));
    SA_T *m = sa_carve(&cur, 3, ldq, sizeof(SA_T)), *l = m + ldq, *alpha = l + ldq;
    const SA_T masked_l2 = (SA_T)(SA_MASKED * SA_LOG2E);  /* the masked score in log2 units */
    const SA_T exact_below = (SA_T)((SA_MASKED + SA_EXACT_MARGIN) * SA_LOG2E);

    /* Q pre-scaled: to log2 units at once, or (with a natural-units pass) by the scale alone */
    const SA_T qscale = (SA_T)(a->scale * (transform ? 1.0 : SA_LOG2E));
    for (int64_t p = 0; p < dk; p++)
        for (int64_t r = 0; r < nqv; r++) qt[p * ldq + r] = r < nq ? q[r * a->rs_q + p] * qscale : 0;
    for (int64_t r = 0; r < ldq; r++) { m[r] = -INFINITY; l[r] = 0; }
    memset(acc, 0, sizeof(SA_T) * nqr * dvp);
    memset(st, 0, sizeof(SA_T) * (bk + SA_BR_MAX) * ldq);  /* padded queries stay finite */

    /* the keys some row of the tile sees: [pb - left, pb + nq - 1 + right] within the item's */
    const int64_t kbeg = pb - a->left > 0 ? (pb - a->left < Sk ? pb - a->left : Sk) : 0;
    const int64_t kend = pb + nq + a->right < Sk ? (pb + nq + a->right > kbeg ? pb + nq + a->right : kbeg) : Sk;
    for (int64_t k0 = kbeg; k0 < kend; k0 += bk) {
        const int64_t nk = bk < kend - k0 ? bk : kend - k0;
        /* partial: some (query, key) pair of the tile is outside the window */
        int partial = k0 < pb + nq - 1 - a->left || k0 + nk - 1 > pb + a->right;
        if (mk) {  /* is every (query, key) pair of the tile masked, or none? (mask bytes are 0/1) */
            uint8_t any = 0, all = 1;
            for (int64_t r = 0; r < (rs_m ? nq : 1); r++) {
                const uint8_t *mrow = mk + r * rs_m + k0;
                uint8_t row_any = 0, row_all = 1;
                for (int64_t j = 0; j < nk; j++) row_any |= mrow[j], row_all &= mrow[j];
                any |= row_any, all &= row_all;
            }
            if (!any) continue;
            partial |= !all;
        }
        const int64_t nk_whole = nk / SA_BR * SA_BR;  /* keys in whole register blocks */
        if (nk_whole < nk) {  /* the last keys, zero-padded to a whole register block */
            memset(kpad, 0, sizeof(SA_T) * SA_BR * dk);
            for (int64_t j = nk_whole; j < nk; j++) memcpy(kpad + (j - nk_whole) * dk, k + (k0 + j) * rs_k, sizeof(SA_T) * dk);
        }
        for (int64_t c0 = 0; c0 < nqv; c0 += SA_NR) {
            /* the tile's keys these query columns can see: a register block wholly outside (the
             * causal diagonal's upper part, a window's edge) is not computed; the masking below
             * covers it, `partial` being set for such a tile */
            const int64_t jlo = pb + c0 - a->left - k0, jhi = pb + c0 + SA_NR - 1 + a->right - k0;
            for (int64_t j0 = 0; j0 < nk_whole; j0 += SA_BR)
                if (j0 <= jhi && j0 + SA_BR - 1 >= jlo)
                    SA_FN(qk_block)(k + (k0 + j0) * rs_k, rs_k, dk, qt + c0, ldq, st + j0 * ldq + c0, ldq);
            if (nk_whole < nk && nk_whole <= jhi && nk - 1 >= jlo)
                SA_FN(qk_block)(kpad, dk, dk, qt + c0, ldq, st + nk_whole * ldq + c0, ldq);
        }
        if (transform) SA_FN(transform_tile)(a, it, q0, nq, nqv, k0, nk, st, ldq);
        if (partial) {
            for (int64_t j = 0; j < nk; j++) {
                SA_T *row = st + j * ldq;  /* key k0 + j against every query of the tile */
                /* the window hides queries r < key - right - pb and r > key + left - pb: two runs */
                const int64_t key = k0 + j, lo = key - a->right - pb, hi = key + a->left - pb;
                for (int64_t r = 0; r < (lo < nq ? lo : nq); r++) row[r] = masked_l2;
                for (int64_t r = hi + 1 > 0 ? hi + 1 : 0; r < nq; r++) row[r] = masked_l2;
                if (mk && !rs_m) {  /* one mask row for all queries (key padding) */
                    if (!mk[k0 + j]) for (int64_t r = 0; r < nq; r++) row[r] = masked_l2;
                } else if (mk) {
                    for (int64_t r = 0; r < nq; r++)
                        if (!mk[r * rs_m + k0 + j]) row[r] = masked_l2;
                }
            }
        }

        for (int64_t c0 = 0; c0 < nqv; c0 += SA_VL) {  /* online softmax, SIMD across queries */
            VEC mt = SA_FN(splat)(-INFINITY), mold = LOAD(m + c0), sum = SA_FN(splat)(0);
            for (int64_t j = 0; j < nk; j++) mt = SA_FN(vmax)(LOAD(st + j * ldq + c0), mt);
            VEC mnew = SA_FN(vmax)(mt, mold);
            /* a row with only -inf scores so far (a -inf bias) keeps weight 0, not NaN */
            mnew = SA_FN(select)(mnew == SA_FN(splat)(-INFINITY), SA_FN(splat)(0), mnew);
            for (int64_t j = 0; j < nk; j++) {
                VEC pj = SA_FN(exp2v)(LOAD(st + j * ldq + c0) - mnew);
                STORE(st + j * ldq + c0, pj);
                sum += pj;
            }
            VEC al = SA_FN(exp2v)(mold - mnew);
            STORE(l + c0, LOAD(l + c0) * al + sum);
            STORE(m + c0, SA_FN(vmax)(mt, mold));
            STORE(alpha + c0, al);
        }
        for (int64_t r = 0; r < nq; r++)
            if (alpha[r] != 1)
                for (int64_t c = 0; c < dvp; c += SA_VL) STORE(acc + r * dvp + c, LOAD(acc + r * dvp + c) * alpha[r]);

        const SA_T *vs = v + k0 * rs_v;
        int64_t ldv = rs_v;
        if (dv != dvp) {  /* pad d_v to whole register blocks */
            for (int64_t j = 0; j < nk; j++)
                for (int64_t c = 0; c < dvp; c++) vp[j * dvp + c] = c < dv ? vs[j * rs_v + c] : 0;
            vs = vp, ldv = dvp;
        }
        for (int64_t r0 = 0; r0 < nqr; r0 += SA_BR) {
            /* keys outside every window of rows r0 .. r0 + SA_BR - 1 weigh exactly 0 (or the row is
             * recomputed exactly): left out of the sum */
            int64_t jlo = pb + r0 - a->left - k0, jhi = pb + r0 + SA_BR - 1 + a->right - k0 + 1;
            jlo = jlo > 0 ? jlo : 0, jhi = jhi < nk ? jhi : nk;
            if (jhi <= jlo) continue;
            for (int64_t c = 0; c < dvp; c += SA_NR)
                SA_FN(pv_block)(st + jlo * ldq + r0, ldq, jhi - jlo, vs + jlo * ldv + c, ldv, acc + r0 * dvp + c, dvp);
        }
    }

    for (int64_t r = 0; r < nq; r++) {
        if (!(m[r] >= exact_below)) {  /* the skipped keys may weigh something (or NaN): be exact */
            SA_FN(exact_row)(a, it, q0 + r, out + r * dv);
            continue;
        }
        const SA_T inv = 1 / l[r];
        for (int64_t c = 0; c < dv; c++) out[r * dv + c] = acc[r * dvp + c] * inv;
        if (a->lse) SA_FN(put_lse)(a, it, q0 + r, m[r], l[r]);
    }
}

/* ---- the rows path: a few query rows (a group: the rows that read one K/V unit) against a long
 * run of keys. The tile kernel would pad them to whole register blocks; here each row's query is
 * a vector held in cache, the keys stream past it SA_VL at a time (independent dot products whose
 * lane sums come out as one vector, see lane_sums), every row of the group reading a block of
 * SA_DEC_BLOCK keys while it is in L1 (so a GQA group reads its K/V once), and the online softmax
 * runs over blocks. The keys of a group are cut into the plan's chunks, the tasks the threads
 * share, each leaving per row a partial result (m, l, acc) that sa_attn_rows_merge combines:
 * m = max m_c, l = sum l_c 2^(m_c - m), out = sum acc_c 2^(m_c - m) / l. */

/* acc[r][0 : cb SA_VL] += sum_{j < nb} p[r][j] v[j][0 : cb SA_VL] for rb rows (rb, cb constants at
 * each call, so the rb x cb accumulators stay in registers and every V row is loaded once for
 * all of them: independent chains, not one chain per row). */
static inline __attribute__((always_inline)) void SA_FN(pv_rows)(const SA_T *restrict p, int64_t ldp, int64_t nb,
                                                             const SA_T *restrict v, int64_t ldv, SA_T *restrict acc,
                                                             int64_t lda, const int rb, const int cb) {
    VEC c[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
#pragma GCC unroll 8
        for (int q = 0; q < cb; q++) c[r][q] = LOAD(acc + r * lda + q * SA_VL);
    for (int64_t j = 0; j < nb; j++) {
        VEC b[8];
#pragma GCC unroll 8
        for (int q = 0; q < cb; q++) b[q] = LOAD(v + j * ldv + q * SA_VL);
#pragma GCC unroll 4
        for (int r = 0; r < rb; r++) {
            const VEC pr = SA_FN(splat)(p[r * ldp + j]);
#pragma GCC unroll 8
            for (int q = 0; q < cb; q++) c[r][q] += pr * b[q];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < rb; r++)
#pragma GCC unroll 8
        for (int q = 0; q < cb; q++) STORE(acc + r * lda + q * SA_VL, c[r][q]);
}

#if SA_X86 && SA_VBYTES == 64 && SA_TBYTES == 4 && defined(__AVX512F__)
/* ---- Four rows of a group against SA_VL keys, each K load shared by the four (float, AVX-512;
 * a group of 4 is Llama 3's and Gemma 3's). Sixteen of a key's values meet the four rows at once,
 * lane l serving row (l / 4 + t) % 4 in copy t of the queries (qa, 4 copies of dk: copy t lane l of
 * vector i = q_{(l/4 + t) % 4}[16 i + l]), so four FMAs per load serve four rows where a dot
 * product per row loaded K four times. Copy t leaves row r's partial sums in 128-bit block
 * (r - t) % 4: rotated into block r and added, a key's vector holds 4 partial sums per row; two
 * in-block levels of shuffle-and-add make them 4 keys' scores, a 4 x 4 transpose of blocks each
 * row's 16. 80 shuffles for 64 scores, where lane_sums per row took 120. */

/* qa of rows q[0..3] (ld ldq), dk % 16 == 0: block c of copy t is block c of row (c + t) % 4 */
static inline void SA_FN(rows4_pack)(const SA_T *q, int64_t ldq, int64_t dk, SA_T *qa) {
    for (int64_t i = 0; i < dk; i += 16) {
        const __m512 x[4] = {_mm512_loadu_ps(q + i), _mm512_loadu_ps(q + ldq + i), _mm512_loadu_ps(q + 2 * ldq + i),
                             _mm512_loadu_ps(q + 3 * ldq + i)};
        for (int t = 0; t < 4; t++) {
            __m512 y = _mm512_mask_blend_ps(0x00f0, x[t], x[(t + 1) % 4]);
            y = _mm512_mask_blend_ps(0x0f00, y, x[(t + 2) % 4]);
            _mm512_storeu_ps(qa + t * dk + i, _mm512_mask_blend_ps(0xf000, y, x[(t + 3) % 4]));
        }
    }
}
/* one key (kr) against the four rows (qa, nv = dk / 16 vectors a copy): 4 partial sums per row, row r in block r */
static inline __attribute__((always_inline)) __m512 SA_FN(rows4_key)(const SA_T *restrict kr, const SA_T *restrict qa,
                                                                     int64_t nv) {
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
#pragma GCC unroll 16
    for (int64_t i = 0; i < nv; i++) {
        const __m512 x = _mm512_loadu_ps(kr + 16 * i);
        c0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(qa + 16 * i), c0);
        c1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(qa + 16 * (nv + i)), c1);
        c2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(qa + 16 * (2 * nv + i)), c2);
        c3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(qa + 16 * (3 * nv + i)), c3);
    }
    return _mm512_add_ps(_mm512_add_ps(c0, _mm512_shuffle_f32x4(c1, c1, 0x93)),  /* blocks moved up 1, 2, 3 */
                         _mm512_add_ps(_mm512_shuffle_f32x4(c2, c2, 0x4e), _mm512_shuffle_f32x4(c3, c3, 0x39)));
}
/* keys a, b, c, d (rows4_key) -> block r: row r's scores of the 4 keys */
static inline __attribute__((always_inline)) __m512 SA_FN(rows4_sum)(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
    const __m512 cd = _mm512_add_ps(_mm512_shuffle_ps(c, d, 0x88), _mm512_shuffle_ps(c, d, 0xdd));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x88), _mm512_shuffle_ps(ab, cd, 0xdd));
}
/* s[r][0:16] = scores of rows r < 4 (qa) against the 16 keys at k (ld ldk) */
static inline __attribute__((always_inline)) void SA_FN(rows4_body)(const SA_T *restrict qa, const SA_T *restrict k,
                                                                   int64_t ldk, int64_t nv, SA_T *restrict s, int64_t lds) {
    __m512 R[4];
#pragma GCC unroll 4
    for (int h = 0; h < 4; h++) {
        const SA_T *kh = k + 4 * h * ldk;
        R[h] = SA_FN(rows4_sum)(SA_FN(rows4_key)(kh, qa, nv), SA_FN(rows4_key)(kh + ldk, qa, nv),
                                SA_FN(rows4_key)(kh + 2 * ldk, qa, nv), SA_FN(rows4_key)(kh + 3 * ldk, qa, nv));
    }
    const __m512 t0 = _mm512_shuffle_f32x4(R[0], R[1], 0x88), t1 = _mm512_shuffle_f32x4(R[0], R[1], 0xdd);
    const __m512 t2 = _mm512_shuffle_f32x4(R[2], R[3], 0x88), t3 = _mm512_shuffle_f32x4(R[2], R[3], 0xdd);
    _mm512_storeu_ps(s, _mm512_shuffle_f32x4(t0, t2, 0x88));
    _mm512_storeu_ps(s + lds, _mm512_shuffle_f32x4(t1, t3, 0x88));
    _mm512_storeu_ps(s + 2 * lds, _mm512_shuffle_f32x4(t0, t2, 0xdd));
    _mm512_storeu_ps(s + 3 * lds, _mm512_shuffle_f32x4(t1, t3, 0xdd));
}
/* Not inlined: inlined into the rows loop, GCC hoisted every K load of the block out of it (the
 * same for each 4 rows) and spilled them all. */
static __attribute__((noinline, aligned(64))) void SA_FN(rows4_dots)(const SA_T *qa, const SA_T *k, int64_t ldk, int64_t dk,
                                                        SA_T *s, int64_t lds) {
    if (dk == 64) SA_FN(rows4_body)(qa, k, ldk, 4, s, lds);
    else if (dk == 128) SA_FN(rows4_body)(qa, k, ldk, 8, s, lds);
    else SA_FN(rows4_body)(qa, k, ldk, dk / 16, s, lds);
}
#define SA_ROWS4 1
#else
#define SA_ROWS4 0
#endif

/* Rows per P V register block of the rows path (rb rows x 4 vectors of accumulators, within the
 * register file: 16 vector registers on AVX2, 32 with AVX-512) */
#if SA_VBYTES == 64
#define SA_PV_RB 4
#else
#define SA_PV_RB 2
#endif

/* acc[0:nrows][0:dvp] += P V over a block of nb keys, P (nrows x nb, ld ldp), V rows at v (ld ldv,
 * dvp columns, a whole number of vectors). */
static void SA_FN(pv_group)(const SA_T *p, int64_t ldp, int64_t nrows, int64_t nb, const SA_T *v, int64_t ldv,
                            SA_T *acc, int64_t lda, int64_t dvp) {
    int64_t c = 0;
    if (nrows == 1)  /* one row (a decoding step): eight columns of chains where they fit */
        for (; c + 8 * SA_VL <= dvp; c += 8 * SA_VL) SA_FN(pv_rows)(p, ldp, nb, v + c, ldv, acc + c, lda, 1, 8);
    for (; c < dvp; c += 4 * SA_VL) {
        const int cols = c + 4 * SA_VL <= dvp;  /* four vectors, else one at a time */
        for (int64_t c1 = c; c1 < (cols ? c + 1 : dvp); c1 += SA_VL) {
            for (int64_t r = 0; r < nrows; r += SA_PV_RB) {
                const int64_t rb = nrows - r < SA_PV_RB ? nrows - r : SA_PV_RB;
                const SA_T *pr = p + r * ldp;
                SA_T *ar = acc + r * lda + c1;
#define SA_PV(RB) (cols ? SA_FN(pv_rows)(pr, ldp, nb, v + c1, ldv, ar, lda, RB, 4) \
                        : SA_FN(pv_rows)(pr, ldp, nb, v + c1, ldv, ar, lda, RB, 1))
                if (rb == SA_PV_RB) SA_PV(SA_PV_RB);
#if SA_PV_RB == 4
                else if (rb == 3) SA_PV(3);
                else if (rb == 2) SA_PV(2);
#endif
                else SA_PV(1);
#undef SA_PV
            }
        }
    }
}

/* The partial results of chunk c, row r of its group at parts + (c->part + r) (dv + 2):
 * (m, l, acc[0:dv]) over keys [c->j0, c->j1) in log2 units. scratch: >= sa_attn_rows_scratch(dk, dv).
 * Each block of keys is read while in L1 by every row of the group: Q K^T SA_VL keys at a time
 * for all rows, then the online softmax row by row, then P V for all rows together. */
static __attribute__((aligned(64))) void SA_FN(sa_attn_rows_part)(const sa_attn_plan *a, const sa_chunk *c, SA_T *parts, SA_T *scratch) {
    const sa_group *g = a->groups + c->group;
    const sa_unit *u = a->units + g->unit;
    const int64_t dk = a->dk, dv = a->dv, rs_k = a->rs_k, rs_v = a->rs_v, nrows = g->nrows;
    const int64_t ldq = dk + SA_COL_PAD, lds = SA_DEC_BLOCK + SA_COL_PAD;
    const int64_t dvp = (dv + SA_VL - 1) / SA_VL * SA_VL;
    /* key j at k + j rs_k for the chunk's keys (a paged plan's chunk lies in one page) */
    int64_t kv[2];
    sa_key_base(a, u->k, u->v, c->j0, kv);
    const SA_T *k = (const SA_T *)a->k + kv[0], *v = (const SA_T *)a->v + kv[1];
    const SA_T masked_l2 = (SA_T)(SA_MASKED * SA_LOG2E);
    const int transform = sa_transforms(a);
    const SA_T qscale = (SA_T)(a->scale * (transform ? 1.0 : SA_LOG2E));
    SA_T *qs = scratch, *s = qs + SA_ROWS_MAX * ldq, *acc = s + SA_ROWS_MAX * lds;
    /* l: each row's running sum as a vector, added up once at the chunk's end */
    SA_T *m = acc + SA_ROWS_MAX * (dv + SA_COL_PAD), *l = m + SA_ROWS_MAX, *vp = l + SA_ROWS_MAX * 16;

    int64_t pos[SA_ROWS_MAX];
    int seen[SA_ROWS_MAX];
    /* the keys to prefetch end with the group's (a paged plan's: the chunk's, the page's rows) */
    const int64_t jend = a->page_keys ? c->j1 : a->chunks[g->chunk0 + g->nchunks - 1].j1;
    for (int64_t r = 0; r < nrows; r++) {
        const sa_row *row = a->rows + g->row0 + r;
        const SA_T *q = (const SA_T *)a->q + a->items[row->item].q + row->i * a->rs_q;
        for (int64_t d = 0; d < dk; d++) qs[r * ldq + d] = q[d] * qscale;
        for (int64_t d = 0; d < dvp; d++) acc[r * dvp + d] = 0;
        m[r] = -INFINITY;
        STORE(l + r * SA_VL, SA_FN(splat)(0));
        pos[r] = a->items[row->item].pos + row->i;
    }
#if SA_ROWS4
    /* a group's rows 4 at a time (Llama 3's and Gemma 3's groups of 4; 8, 16), their queries as
     * rows4_dots reads them past the V block */
    SA_T *qa = vp + SA_DEC_BLOCK * dvp;
    const int four = nrows % 4 == 0 && dk % 16 == 0;
    if (four)
        for (int64_t r = 0; r < nrows; r += 4) SA_FN(rows4_pack)(qs + r * ldq, ldq, dk, qa + r * dk);
#endif
    for (int64_t k0 = c->j0; k0 < c->j1; k0 += SA_DEC_BLOCK) {
        const int64_t nb = SA_DEC_BLOCK < c->j1 - k0 ? SA_DEC_BLOCK : c->j1 - k0;
        const int64_t nbv = (nb + SA_VL - 1) / SA_VL * SA_VL;
        for (int64_t r = 0; r < nrows; r++)  /* does row r see a key of the block? */
            seen[r] = !(k0 + nb - 1 < pos[r] - a->left || k0 > pos[r] + a->right);
        int64_t j = 0;
        for (; j + SA_VL <= nb; j += SA_VL) {  /* SA_VL keys at a time, for every row while in L1 */
            /* the next block's K rows of these keys towards L2; its V rows are left to the hardware's
             * prefetcher: prefetching them too cost 10-15% from cache and gained nothing from memory
             * (one and two Zen 4 cores, groups of 1, 2 and 4 rows) */
            if (a->stream)
                for (int64_t u = k0 + SA_DEC_BLOCK + j; u < k0 + SA_DEC_BLOCK + j + SA_VL && u < jend; u++) {
                    const char *kr = (const char *)(k + u * rs_k);
                    for (int64_t b = 0; b < dk * (int64_t)sizeof(SA_T); b += 64) __builtin_prefetch(kr + b, 0, 2);
                }
#if SA_ROWS4
            if (four) {  /* a row that sees none of the block gets scores too, zeroed below */
                for (int64_t r = 0; r < nrows; r += 4)
                    SA_FN(rows4_dots)(qa + r * dk, k + (k0 + j) * rs_k, rs_k, dk, s + r * lds + j, lds);
                continue;
            }
#endif
            for (int64_t r = 0; r < nrows; r++)
                if (seen[r]) STORE(s + r * lds + j, SA_FN(dots)(qs + r * ldq, k + (k0 + j) * rs_k, rs_k, dk));
        }
        for (; j < nb; j++) {
            const SA_T *kr = k + (k0 + j) * rs_k;
            for (int64_t r = 0; r < nrows; r++) s[r * lds + j] = SA_FN(dot)(qs + r * ldq, kr, dk);
        }
        for (int64_t r = 0; r < nrows; r++) {
            SA_T *sr = s + r * lds;
            if (!seen[r]) {  /* weighs nothing in the P V below */
                for (j = 0; j < nbv; j++) sr[j] = 0;
                continue;
            }
            const sa_row *row = a->rows + g->row0 + r;
            const sa_item *it = a->items + row->item;
            const int64_t p = pos[r];
            if (transform) {  /* natural units: softcap, bias, ALiBi, then log2 units */
                if (a->softcap > 0) {
                    const VEC cap = SA_FN(splat)((SA_T)a->softcap), inv = SA_FN(splat)((SA_T)(1 / a->softcap));
                    for (j = 0; j < nb; j += SA_VL) STORE(sr + j, cap * SA_FN(tanhv)(LOAD(sr + j) * inv));
                }
                if (a->has_bias) {
                    const SA_T *brow = (const SA_T *)a->bias + it->bias + row->i * a->rs_bias + k0;
                    for (j = 0; j < nb; j++) sr[j] += brow[j];
                }
                if (a->has_alibi) {
                    const SA_T slope = -(SA_T)it->slope, d0 = (SA_T)(p - k0);  /* p - key = d0 - j */
                    for (j = 0; j < nb; j++) sr[j] += slope * SA_ABS(d0 - (SA_T)j);
                }
                for (j = 0; j < nb; j++) sr[j] *= (SA_T)SA_LOG2E;
            }
            if (k0 < p - a->left || k0 + nb - 1 > p + a->right)  /* the window's edge is in the block */
                for (j = 0; j < nb; j++)
                    if (!SA_FN(in_window)(a, p, k0 + j)) sr[j] = masked_l2;
            if (a->has_mask) {
                const uint8_t *mrow = a->mask + it->mask + row->i * a->rs_mask + k0;
                for (j = 0; j < nb; j++) sr[j] = mrow[j] ? sr[j] : masked_l2;
            }
            for (j = nb; j < nbv; j++) sr[j] = -INFINITY;  /* weighs 0 */
            VEC mv = SA_FN(splat)(m[r]);  /* a NaN score is not the max, but its weight, NaN, spreads */
            for (j = 0; j < nb; j += SA_VL) mv = SA_FN(vmax)(LOAD(sr + j), mv);
            const SA_T mnew = SA_FN(hmax)(mv), mref = mnew == -INFINITY ? 0 : mnew;  /* all -inf: weight 0 */
            VEC sum = SA_FN(splat)(0);
            for (j = 0; j < nb; j += SA_VL) {
                VEC pj = SA_FN(exp2v)(LOAD(sr + j) - mref);
                STORE(sr + j, pj);
                sum += pj;
            }
            const SA_T alpha = (SA_T)exp2((double)(m[r] - mref));
            STORE(l + r * SA_VL, LOAD(l + r * SA_VL) * alpha + sum);
            if (alpha != 1) {
                const VEC al = SA_FN(splat)(alpha);
                for (int64_t cc = 0; cc < dvp; cc += SA_VL) STORE(acc + r * dvp + cc, LOAD(acc + r * dvp + cc) * al);
            }
            m[r] = mnew;
        }
        const SA_T *vb = v + k0 * rs_v;
        int64_t ldv = rs_v;
        if (dv != dvp) {  /* pad d_v to whole vectors */
            for (j = 0; j < nb; j++)
                for (int64_t cc = 0; cc < dvp; cc++) vp[j * dvp + cc] = cc < dv ? vb[j * rs_v + cc] : 0;
            vb = vp, ldv = dvp;
        }
        SA_FN(pv_group)(s, lds, nrows, nb, vb, ldv, acc, dvp, dvp);
    }
    for (int64_t r = 0; r < nrows; r++) {
        SA_T *part = parts + (c->part + r) * (dv + 2);
        part[0] = m[r], part[1] = SA_FN(hsum)(LOAD(l + r * SA_VL));
        for (int64_t d = 0; d < dv; d++) part[2 + d] = acc[r * dvp + d];
    }
}

/* Each row of group g from its chunks' partial results: out[item.out + i dv ...]. */
static void SA_FN(sa_attn_rows_merge)(const sa_attn_plan *a, const sa_group *g, const SA_T *parts) {
    const int64_t dv = a->dv;
    const SA_T exact_below = (SA_T)((SA_MASKED + SA_EXACT_MARGIN) * SA_LOG2E);
    for (int64_t r = 0; r < g->nrows; r++) {
        const sa_row *row = a->rows + g->row0 + r;
        const sa_item *it = a->items + row->item;
        SA_T *out = (SA_T *)a->out + it->out + row->i * dv;
        SA_T m = -INFINITY, l = 0;
        for (int64_t c = g->chunk0; c < g->chunk0 + g->nchunks; c++) {
            const SA_T mc = parts[(a->chunks[c].part + r) * (dv + 2)];
            m = (mc > m || mc != mc) ? mc : m;
        }
        if (!(m >= exact_below)) {  /* see attention.h */
            SA_FN(exact_row)(a, it, row->i, out);
            continue;
        }
        for (int64_t d = 0; d < dv; d++) out[d] = 0;
        for (int64_t c = g->chunk0; c < g->chunk0 + g->nchunks; c++) {
            const SA_T *part = parts + (a->chunks[c].part + r) * (dv + 2);
            if (part[0] == -INFINITY) continue;  /* no key of the chunk was seen */
            const SA_T w = (SA_T)exp2((double)(part[0] - m));
            l += part[1] * w;
            for (int64_t d = 0; d < dv; d++) out[d] += part[2 + d] * w;
        }
        const SA_T inv = 1 / l;
        for (int64_t d = 0; d < dv; d++) out[d] *= inv;
        if (a->lse) SA_FN(put_lse)(a, it, row->i, m, l);
    }
}
#undef SA_BR
#undef SA_ABS
#undef SA_PV_RB
#undef SA_ROWS4
