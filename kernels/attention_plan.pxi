# The attention plan (kernels/attention_plan.h) as both attention modules declare and fill it.
cdef extern from "attention_plan.h" nogil:
    ctypedef packed struct sa_item:
        int64_t q, k, v, mask, bias, out, sq, sk, pos, unit
        double slope
    ctypedef packed struct sa_unit:
        int64_t k, v, sk
    ctypedef packed struct sa_task:
        int64_t item, q0, rows
    ctypedef packed struct sa_group:
        int64_t unit, row0, nrows, chunk0, nchunks
    ctypedef packed struct sa_row:
        int64_t item, i
    ctypedef packed struct sa_chunk:
        int64_t group, j0, j1, part
    ctypedef struct sa_attn_plan:
        const void *q
        const void *k
        const void *v
        const void *bias
        const uint8_t *mask
        void *out
        int64_t rs_q, rs_k, rs_v, rs_mask, rs_bias, dk, dv, bq, bk
        double scale, softcap
        int64_t left, right
        int has_mask, has_bias, has_alibi
        int stream
        const sa_item *items
        const sa_unit *units
        const sa_task *tasks
        const sa_group *groups
        const sa_row *rows
        const sa_chunk *chunks
        int64_t page_keys
        const int64_t *pages
        void *lse


cdef inline const void *_data(cnp.ndarray a):
    """The first element of one of the plan's tables (C-contiguous arrays of the dtypes in
    silkattn._plan, which attention_plan.h mirrors field for field)."""
    return cnp.PyArray_DATA(a)


cdef _fill_plan(sa_attn_plan *a, plan):
    """a's fields from the plan but its arrays' pointers and bk (the caller's, from views that check
    the dtypes) and lse (NULL)."""
    a.rs_q, a.rs_k, a.rs_v, a.rs_mask, a.rs_bias = plan.rs_q, plan.rs_k, plan.rs_v, plan.rs_mask, plan.rs_bias
    a.dk, a.dv, a.bq = plan.dk, plan.dv, max(plan.bq, 1)
    a.scale, a.softcap, a.left, a.right = plan.scale, plan.softcap, plan.left, plan.right
    a.has_mask, a.has_bias, a.has_alibi = plan.has_mask, plan.has_bias, plan.has_alibi
    a.stream = plan.stream
    a.items, a.units = <const sa_item *>_data(plan.items), <const sa_unit *>_data(plan.units)
    a.tasks, a.groups, a.rows, a.chunks = NULL, NULL, NULL, NULL
    a.page_keys, a.pages, a.lse = plan.page_keys, NULL, NULL
    if plan.page_keys:
        a.pages = <const int64_t *>_data(plan.pages)
