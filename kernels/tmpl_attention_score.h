/* The score of one (query, key) pair, for the exact one-row paths of attention and its backward.
 * Template (instances.h), included by tmpl_attention.h and tmpl_attention_backward.h. */
/* Is key j visible to the query at position p (the plan's window, causal folded in)? */
static inline int SA_FN(in_window)(const sa_attn_plan *a, int64_t p, int64_t j) {
    return j >= p - a->left && j <= p + a->right;
}

/* The score of query row i of item `it` against key j, in natural units, from its raw dot product
 * (the reference's order: scale, softcap, bias, ALiBi; hiding is the caller's). */
static inline SA_T SA_FN(score)(const sa_attn_plan *a, const sa_item *it, int64_t i, int64_t j, SA_T dot) {
    SA_T s = dot * (SA_T)a->scale;
    if (a->softcap > 0) s = (SA_T)a->softcap * (SA_T)tanh((double)(s / (SA_T)a->softcap));
    if (a->has_bias) s += ((const SA_T *)a->bias)[it->bias + i * a->rs_bias + j];
    if (a->has_alibi) {
        const int64_t d = it->pos + i - j;
        s += -(SA_T)it->slope * (SA_T)(d < 0 ? -d : d);
    }
    return s;
}
