/* Flash attention for one (batch item, query tile). Template: see instances.h.
 *
 * Scores are kept transposed, st[key][query], so queries are the SIMD axis: the query tile (up to
 * bq rows, pre-scaled by log2(e)/sqrt(d_k) so exp becomes exp2) is packed once as Q^T, keys are
 * read straight from K (no per-tile transpose), and the online softmax over keys is vertical
 * vector work (running max m and sum l per query, no horizontal reductions). Key tiles of bk:
 * S^T = K Q^T from SA_BR-key x (2 vectors of queries) register blocks, then O += P V from SA_BR-query x
 * (2 vectors of d_v) blocks. The Sq x Sk score matrix never exists: scratch is O((bq + d) * bk).
 *
 * Masked scores are replaced by -1e9 (the reference's rule). Tiles that are entirely masked, and
 * key tiles past the causal diagonal, are skipped: their keys would each weigh exp(-1e9 - m),
 * exactly 0 unless the row's final max m is itself near -1e9 (a fully masked row, or absurd
 * scores). Such rare rows are recomputed exactly over all keys by exact_row. */
#include "tmpl_simd.h"
#define SA_NR (2 * SA_VL)  /* columns per register block: queries of S^T, or d_v columns of O */
/* Rows per register block: 2 SA_BR accumulators + 2 operands + 1 broadcast must fit the register
 * file (16 vector registers on AVX2, 32 with AVX-512). */
#if SA_VBYTES == 64
#define SA_BR SA_MR_WIDE
#else
#define SA_BR SA_MR
#endif

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

/* One query row straight from the definition, in the natural (not log2) domain: the rare rows
 * whose max is within SA_EXACT_MARGIN of the masked score (see attention.h). */
static void SA_FN(exact_row)(const sa_attn_args *a, int64_t b, int64_t i, SA_T *restrict out) {
    const SA_T *q = (const SA_T *)a->q + a->offsets[4 * b] + i * a->rs[0];
    const SA_T *k = (const SA_T *)a->k + a->offsets[4 * b + 1];
    const SA_T *v = (const SA_T *)a->v + a->offsets[4 * b + 2];
    const uint8_t *mrow = a->masked ? a->mask + a->offsets[4 * b + 3] + i * a->rs[3] : NULL;
    const SA_T scale = (SA_T)sqrt((double)a->dk);
    SA_T m = -INFINITY, sum = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t j = 0; j < sa_item_sk(a, b); j++) {
            SA_T s = (SA_T)SA_MASKED;
            if (!(a->causal && j > i + a->q_offset) && !(mrow && !mrow[j])) {
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
    const int64_t Sq = sa_item_sq(a, b), Sk = sa_item_sk(a, b);
    const int64_t nq = a->bq < Sq - q0 ? a->bq : Sq - q0;
    const int64_t nqv = (nq + SA_NR - 1) / SA_NR * SA_NR;  /* query columns of S^T computed */
    const int64_t nqr = (nq + SA_BR - 1) / SA_BR * SA_BR;  /* query rows of the P V blocks */
    const int64_t ldq = a->bq + SA_COL_PAD, dvp = (dv + SA_NR - 1) / SA_NR * SA_NR;
    const int64_t off = a->q_offset;                       /* query r of the tile sits at q0 + off + r */
    const SA_T *q = (const SA_T *)a->q + a->offsets[4 * b] + q0 * a->rs[0];
    const SA_T *k = (const SA_T *)a->k + a->offsets[4 * b + 1];
    const SA_T *v = (const SA_T *)a->v + a->offsets[4 * b + 2];
    const uint8_t *mk = a->masked ? a->mask + a->offsets[4 * b + 3] + q0 * rs_m : NULL;
    SA_T *out = (SA_T *)a->out + sa_item_out(a, b) + q0 * dv;
    char *cur = (char *)scratch;
    SA_T *qt = sa_carve(&cur, dk, ldq, sizeof(SA_T)), *st = sa_carve(&cur, bk + SA_MR_MAX, ldq, sizeof(SA_T));
    SA_T *kpad = sa_carve(&cur, SA_MR_MAX, dk, sizeof(SA_T)), *vp = sa_carve(&cur, bk, dv + SA_COL_PAD, sizeof(SA_T));
    SA_T *acc = sa_carve(&cur, a->bq + SA_MR_MAX, dv + SA_COL_PAD, sizeof(SA_T));
    SA_T *m = sa_carve(&cur, 3, ldq, sizeof(SA_T)), *l = m + ldq, *alpha = l + ldq;
    const SA_T masked_l2 = (SA_T)(SA_MASKED * SA_LOG2E);  /* the masked score in log2 units */
    const SA_T exact_below = (SA_T)((SA_MASKED + SA_EXACT_MARGIN) * SA_LOG2E);

    const SA_T qscale = (SA_T)(SA_LOG2E / sqrt((double)dk));
    for (int64_t p = 0; p < dk; p++)
        for (int64_t r = 0; r < nqv; r++) qt[p * ldq + r] = r < nq ? q[r * a->rs[0] + p] * qscale : 0;
    for (int64_t r = 0; r < ldq; r++) { m[r] = -INFINITY; l[r] = 0; }
    memset(acc, 0, sizeof(SA_T) * nqr * dvp);
    memset(st, 0, sizeof(SA_T) * (bk + SA_MR_MAX) * ldq);  /* padded queries stay finite */

    /* causal: keys past the last row's diagonal are masked for every row of the tile */
    const int64_t kend = a->causal && q0 + off + nq < Sk ? q0 + off + nq : Sk;
    for (int64_t k0 = 0; k0 < kend; k0 += bk) {
        const int64_t nk = bk < kend - k0 ? bk : kend - k0;
        int partial = a->causal && k0 + nk - 1 > q0 + off;
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
        const int64_t nk6 = nk / SA_BR * SA_BR;
        if (nk6 < nk) {  /* the last keys, zero-padded to a whole register block */
            memset(kpad, 0, sizeof(SA_T) * SA_BR * dk);
            for (int64_t j = nk6; j < nk; j++) memcpy(kpad + (j - nk6) * dk, k + (k0 + j) * rs_k, sizeof(SA_T) * dk);
        }
        for (int64_t c0 = 0; c0 < nqv; c0 += SA_NR) {
            for (int64_t j0 = 0; j0 < nk6; j0 += SA_BR)
                SA_FN(qk_block)(k + (k0 + j0) * rs_k, rs_k, dk, qt + c0, ldq, st + j0 * ldq + c0, ldq);
            if (nk6 < nk) SA_FN(qk_block)(kpad, dk, dk, qt + c0, ldq, st + nk6 * ldq + c0, ldq);
        }
        if (partial) {
            for (int64_t j = 0; j < nk; j++) {
                SA_T *row = st + j * ldq;  /* key k0 + j against every query of the tile */
                if (a->causal) {  /* queries r < k0 + j - q0 - off are before the key: a run, not a test */
                    const int64_t cut = k0 + j - q0 - off < nq ? k0 + j - q0 - off : nq;
                    for (int64_t r = 0; r < cut; r++) row[r] = masked_l2;
                }
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
            for (int64_t j = 0; j < nk; j++) {
                VEC pj = SA_FN(exp2v)(LOAD(st + j * ldq + c0) - mnew);
                STORE(st + j * ldq + c0, pj);
                sum += pj;
            }
            VEC al = SA_FN(exp2v)(mold - mnew);
            STORE(l + c0, LOAD(l + c0) * al + sum);
            STORE(m + c0, mnew);
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
        for (int64_t c = 0; c < dvp; c += SA_NR)
            for (int64_t r0 = 0; r0 < nqr; r0 += SA_BR)
                SA_FN(pv_block)(st + r0, ldq, nk, vs + c, ldv, acc + r0 * dvp + c, dvp);
    }

    for (int64_t r = 0; r < nq; r++) {
        if (m[r] < exact_below) {  /* the skipped keys may weigh something: be exact */
            SA_FN(exact_row)(a, b, q0 + r, out + r * dv);
            continue;
        }
        const SA_T inv = 1 / l[r];
        for (int64_t c = 0; c < dv; c++) out[r * dv + c] = acc[r * dvp + c] * inv;
    }
}

/* ---- single-query (decode) attention: one query row against a long run of keys ----
 * The tile kernel would pad the one query to a whole register block; here the query is a vector
 * held in cache, the keys stream past it SA_VL at a time (independent dot products whose lane
 * sums come out as one vector, see lane_sums), and the online softmax runs over blocks of
 * SA_DEC_BLOCK keys. A call splits each batch item's keys into chunks
 * (when there are fewer items than threads), each chunk leaving a partial result (m, l, acc) that
 * sa_attn_decode_merge combines: m = max m_c, l = sum l_c 2^(m_c - m), out = sum acc_c 2^(m_c - m) / l. */

/* part = (m, l, acc[0:dv]) over keys [j0, j1) of batch item b (log2 units, as the tile kernel).
 * scratch: >= sa_attn_decode_scratch(dk) elements. */
static void SA_FN(sa_attn_decode_part)(const sa_attn_args *a, int64_t b, int64_t j0, int64_t j1, SA_T *part,
                                      SA_T *scratch) {
    const int64_t dk = a->dk, dv = a->dv, rs_k = a->rs[1], rs_v = a->rs[2];
    const int64_t dkv = dk - dk % SA_VL, dvv = dv - dv % SA_VL;
    const SA_T *q = (const SA_T *)a->q + a->offsets[4 * b];
    const SA_T *k = (const SA_T *)a->k + a->offsets[4 * b + 1];
    const SA_T *v = (const SA_T *)a->v + a->offsets[4 * b + 2];
    const uint8_t *mrow = a->masked ? a->mask + a->offsets[4 * b + 3] : NULL;
    const SA_T masked_l2 = (SA_T)(SA_MASKED * SA_LOG2E), qscale = (SA_T)(SA_LOG2E / sqrt((double)dk));
    SA_T *qs = scratch, *s = scratch + (dk + SA_COL_PAD), *acc = part + 2;
    for (int64_t d = 0; d < dk; d++) qs[d] = q[d] * qscale;
    for (int64_t c = 0; c < dv; c++) acc[c] = 0;
    SA_T m = -INFINITY, l = 0;
    for (int64_t k0 = j0; k0 < j1; k0 += SA_DEC_BLOCK) {
        const int64_t nb = SA_DEC_BLOCK < j1 - k0 ? SA_DEC_BLOCK : j1 - k0;
        int64_t j = 0;
        for (; j + SA_VL <= nb; j += SA_VL)  /* SA_VL keys at a time */
            STORE(s + j, SA_FN(dots)(qs, k + (k0 + j) * rs_k, rs_k, dk));
        for (; j < nb; j++) {
            const SA_T *kr = k + (k0 + j) * rs_k;
            VEC c0 = SA_FN(splat)(0);
            int64_t d = 0;
            for (; d < dkv; d += SA_VL) c0 += LOAD(qs + d) * LOAD(kr + d);
            SA_T s0 = SA_FN(hsum)(c0);
            for (; d < dk; d++) s0 += qs[d] * kr[d];
            s[j] = s0;
        }
        if (mrow)
            for (j = 0; j < nb; j++) s[j] = mrow[k0 + j] ? s[j] : masked_l2;
        for (j = nb; j < (nb + SA_VL - 1) / SA_VL * SA_VL; j++) s[j] = -INFINITY;  /* weighs 0 */
        VEC mv = SA_FN(splat)(m);  /* a NaN score is not the max, but its weight, NaN, spreads */
        for (j = 0; j < nb; j += SA_VL) mv = SA_FN(vmax)(LOAD(s + j), mv);
        const SA_T mnew = SA_FN(hmax)(mv);
        VEC sum = SA_FN(splat)(0);
        for (j = 0; j < nb; j += SA_VL) {
            VEC p = SA_FN(exp2v)(LOAD(s + j) - mnew);
            STORE(s + j, p);
            sum += p;
        }
        const SA_T alpha = (SA_T)exp2((double)(m - mnew));
        l = l * alpha + SA_FN(hsum)(sum);
        if (alpha != 1)
            for (int64_t c = 0; c < dv; c++) acc[c] *= alpha;
        m = mnew;
        const SA_T *vb = v + k0 * rs_v;
        int64_t c = 0;
        for (; c + 8 * SA_VL <= dvv; c += 8 * SA_VL) {  /* eight registers of d_v: eight chains */
            VEC a8[8];
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) a8[u] = LOAD(acc + c + u * SA_VL);
            for (j = 0; j < nb; j++) {
                const SA_T *vr = vb + j * rs_v + c;
                const VEC p = SA_FN(splat)(s[j]);
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++) a8[u] += p * LOAD(vr + u * SA_VL);
            }
#pragma GCC unroll 8
            for (int u = 0; u < 8; u++) STORE(acc + c + u * SA_VL, a8[u]);
        }
        for (; c + 4 * SA_VL <= dvv; c += 4 * SA_VL) {  /* four registers of d_v: four chains */
            VEC a0 = LOAD(acc + c), a1 = LOAD(acc + c + SA_VL), a2 = LOAD(acc + c + 2 * SA_VL);
            VEC a3 = LOAD(acc + c + 3 * SA_VL);
            for (j = 0; j < nb; j++) {
                const SA_T *vr = vb + j * rs_v + c;
                const SA_T p = s[j];
                a0 += p * LOAD(vr); a1 += p * LOAD(vr + SA_VL); a2 += p * LOAD(vr + 2 * SA_VL);
                a3 += p * LOAD(vr + 3 * SA_VL);
            }
            STORE(acc + c, a0); STORE(acc + c + SA_VL, a1); STORE(acc + c + 2 * SA_VL, a2);
            STORE(acc + c + 3 * SA_VL, a3);
        }
        for (; c < dvv; c += SA_VL) {
            VEC a0 = LOAD(acc + c);
            for (j = 0; j < nb; j++) a0 += s[j] * LOAD(vb + j * rs_v + c);
            STORE(acc + c, a0);
        }
        for (; c < dv; c++)
            for (j = 0; j < nb; j++) acc[c] += s[j] * vb[j * rs_v + c];
    }
    part[0] = m, part[1] = l;
}

/* out (dv) for batch item b from its nsplit partial results (each dv + 2 values). */
static void SA_FN(sa_attn_decode_merge)(const sa_attn_args *a, int64_t b, int64_t nsplit, const SA_T *parts,
                                       SA_T *out) {
    const int64_t dv = a->dv;
    SA_T m = -INFINITY, l = 0;
    for (int64_t c = 0; c < nsplit; c++) {
        const SA_T mc = parts[c * (dv + 2)];
        m = (mc > m || mc != mc) ? mc : m;
    }
    if (m < (SA_T)((SA_MASKED + SA_EXACT_MARGIN) * SA_LOG2E)) {  /* see attention.h */
        SA_FN(exact_row)(a, b, 0, out);
        return;
    }
    for (int64_t d = 0; d < dv; d++) out[d] = 0;
    for (int64_t c = 0; c < nsplit; c++) {
        const SA_T *part = parts + c * (dv + 2);
        const SA_T w = (SA_T)exp2((double)(part[0] - m));
        l += part[1] * w;
        for (int64_t d = 0; d < dv; d++) out[d] += part[2 + d] * w;
    }
    const SA_T inv = 1 / l;
    for (int64_t d = 0; d < dv; d++) out[d] *= inv;
}
#undef SA_BR
