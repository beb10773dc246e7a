/* Byte-level BPE encoding for the pre-tokenizers of Llama 3's regular expression and Qwen2's (the
 * same with single digits):
 *
 *   '[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD] | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,D}
 *   |  ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * found leftmost-first as a backtracking regex engine finds it (D = 3 for Llama 3, 1 for Qwen2);
 * each piece is then the vocabulary's token for its bytes when ignore_merges and the vocabulary has
 * it, else its bytes merged pair by pair, the lowest-ranked pair first and the leftmost of equals.
 *
 * Tables: token bytes -> id, (left id, right id) -> (rank, merged id), both open addressing; a flag
 * byte per code point (SA_BP_LETTER, SA_BP_NUMBER, SA_BP_SPACE) given by the caller. The text is
 * valid UTF-8 (Python's str.encode writes it). A text of n bytes gives at most n ids. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SA_BP_LETTER 1
#define SA_BP_NUMBER 2
#define SA_BP_SPACE 4
#define SA_BP_CODEPOINTS 0x110000

typedef struct {
    uint8_t *bytes;          /* every token's bytes end to end */
    int64_t *offset;         /* entry e: bytes[offset[e]:offset[e + 1]] */
    int32_t *id;             /* entry e's token id */
    int32_t *slot;           /* capacity tok_mask + 1: an entry or -1 */
    uint64_t tok_mask;
    uint64_t *pair_key;      /* capacity pair_mask + 1: left << 32 | right, or UINT64_MAX */
    int32_t *pair_rank, *pair_id;
    uint64_t pair_mask;
    int32_t byte_id[256];    /* the token of each single byte (all 256 present) */
    const uint8_t *flags;    /* SA_BP_CODEPOINTS flag bytes, owned by the caller */
    int digits, ignore_merges;
} sa_bytepair;

static uint64_t sa_bp_hash_bytes(const uint8_t *s, int64_t n) {
    uint64_t h = 1469598103934665603ULL;  /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
    return h;
}

static uint64_t sa_bp_hash_pair(uint64_t key) { return (key * 0x9E3779B97F4A7C15ULL) >> 17; }

static uint64_t sa_bp_capacity(int64_t n) {  /* a power of two >= 2 n */
    uint64_t c = 16;
    while (c < 2 * (uint64_t)n) c <<= 1;
    return c;
}

static int32_t sa_bp_token(const sa_bytepair *m, const uint8_t *s, int64_t n) {  /* -> id or -1 */
    for (uint64_t h = sa_bp_hash_bytes(s, n) & m->tok_mask;; h = (h + 1) & m->tok_mask) {
        int32_t e = m->slot[h];
        if (e < 0) return -1;
        if (m->offset[e + 1] - m->offset[e] == n && memcmp(m->bytes + m->offset[e], s, n) == 0)
            return m->id[e];
    }
}

static int sa_bp_pair(const sa_bytepair *m, int32_t a, int32_t b, int32_t *rank, int32_t *id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t h = sa_bp_hash_pair(key) & m->pair_mask;; h = (h + 1) & m->pair_mask) {
        if (m->pair_key[h] == UINT64_MAX) return 0;
        if (m->pair_key[h] == key) { *rank = m->pair_rank[h]; *id = m->pair_id[h]; return 1; }
    }
}

static void sa_bytepair_free(sa_bytepair *m) {
    free(m->bytes); free(m->offset); free(m->id); free(m->slot);
    free(m->pair_key); free(m->pair_rank); free(m->pair_id);
    memset(m, 0, sizeof *m);
}

/* Entries in order, a later one with the same bytes replacing the earlier (as a Python dict built in
 * order); merge r: (left[r], right[r]) -> merged[r] with rank r, a later equal pair replacing too.
 * The ids are < n_ids (checked by the caller). -> 0, or -1 when out of memory, or -2 when a single
 * byte has no token. */
static int sa_bytepair_init(sa_bytepair *m, const uint8_t *bytes, const int64_t *offset, const int32_t *id,
                            int64_t n_tokens, const int32_t *left, const int32_t *right, const int32_t *merged,
                            int64_t n_merges, const uint8_t *flags, int digits, int ignore_merges) {
    memset(m, 0, sizeof *m);
    m->flags = flags; m->digits = digits; m->ignore_merges = ignore_merges;
    uint64_t tc = sa_bp_capacity(n_tokens), pc = sa_bp_capacity(n_merges);
    m->bytes = malloc(offset[n_tokens] > 0 ? (size_t)offset[n_tokens] : 1);
    m->offset = malloc((size_t)(n_tokens + 1) * sizeof(int64_t));
    m->id = malloc((size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof(int32_t));
    m->slot = malloc(tc * sizeof(int32_t));
    m->pair_key = malloc(pc * sizeof(uint64_t));
    m->pair_rank = malloc(pc * sizeof(int32_t));
    m->pair_id = malloc(pc * sizeof(int32_t));
    if (!m->bytes || !m->offset || !m->id || !m->slot || !m->pair_key || !m->pair_rank || !m->pair_id) {
        sa_bytepair_free(m);
        return -1;
    }
    memcpy(m->bytes, bytes, (size_t)offset[n_tokens]);
    memcpy(m->offset, offset, (size_t)(n_tokens + 1) * sizeof(int64_t));
    memcpy(m->id, id, (size_t)n_tokens * sizeof(int32_t));
    m->tok_mask = tc - 1; m->pair_mask = pc - 1;
    memset(m->slot, 0xff, tc * sizeof(int32_t));
    memset(m->pair_key, 0xff, pc * sizeof(uint64_t));
    for (int64_t e = 0; e < n_tokens; e++) {
        const uint8_t *s = m->bytes + offset[e];
        int64_t n = offset[e + 1] - offset[e];
        uint64_t h = sa_bp_hash_bytes(s, n) & m->tok_mask;
        for (;; h = (h + 1) & m->tok_mask) {
            int32_t f = m->slot[h];
            if (f < 0 || (offset[f + 1] - offset[f] == n && memcmp(m->bytes + offset[f], s, n) == 0)) break;
        }
        m->slot[h] = (int32_t)e;
    }
    for (int64_t r = 0; r < n_merges; r++) {
        uint64_t key = (uint64_t)(uint32_t)left[r] << 32 | (uint32_t)right[r];
        uint64_t h = sa_bp_hash_pair(key) & m->pair_mask;
        while (m->pair_key[h] != UINT64_MAX && m->pair_key[h] != key) h = (h + 1) & m->pair_mask;
        m->pair_key[h] = key; m->pair_rank[h] = (int32_t)r; m->pair_id[h] = merged[r];
    }
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        if ((m->byte_id[b] = sa_bp_token(m, &c, 1)) < 0) { sa_bytepair_free(m); return -2; }
    }
    return 0;
}

/* The merges of one piece. Scratch: 3 n int32 for the symbols, 3 n heap entries. */
/* key: rank << 32 | left, so the heap gives the lowest rank and, of equals, the leftmost pair */
typedef struct { uint64_t key; int32_t right, left_id, right_id, merged; } sa_bp_entry;

static void sa_bp_push(sa_bp_entry *heap, int64_t *size, sa_bp_entry e) {
    int64_t i = (*size)++;
    while (i > 0 && heap[(i - 1) / 2].key > e.key) { heap[i] = heap[(i - 1) / 2]; i = (i - 1) / 2; }
    heap[i] = e;
}

static sa_bp_entry sa_bp_pop(sa_bp_entry *heap, int64_t *size) {
    sa_bp_entry top = heap[0], last = heap[--*size];
    int64_t i = 0, n = *size;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap[c + 1].key < heap[c].key) c++;
        if (heap[c].key >= last.key) break;
        heap[i] = heap[c]; i = c;
    }
    if (n > 0) heap[i] = last;
    return top;
}

static void sa_bp_offer(const sa_bytepair *m, const int32_t *sym, sa_bp_entry *heap, int64_t *size,
                        int32_t left, int32_t right) {
    int32_t rank, id;
    if (sa_bp_pair(m, sym[left], sym[right], &rank, &id))
        sa_bp_push(heap, size, (sa_bp_entry){(uint64_t)(uint32_t)rank << 32 | (uint32_t)left, right,
                                             sym[left], sym[right], id});
}

static int64_t sa_bp_merge(const sa_bytepair *m, const uint8_t *s, int32_t n, int32_t *out,
                           int32_t *sym, int32_t *next, int32_t *prev, sa_bp_entry *heap) {
    int64_t size = 0;
    for (int32_t i = 0; i < n; i++) { sym[i] = m->byte_id[s[i]]; next[i] = i + 1; prev[i] = i - 1; }
    for (int32_t i = 0; i + 1 < n; i++) sa_bp_offer(m, sym, heap, &size, i, i + 1);
    while (size > 0) {
        sa_bp_entry e = sa_bp_pop(heap, &size);
        int32_t left = (int32_t)(uint32_t)e.key, right = e.right;
        /* stale: a side was merged away or changed since the pair was offered */
        if (sym[left] < 0 || sym[right] < 0 || next[left] != right || sym[left] != e.left_id ||
            sym[right] != e.right_id)
            continue;
        sym[left] = e.merged; sym[right] = -1;
        next[left] = next[right];
        if (next[right] < n) prev[next[right]] = left;
        if (prev[left] >= 0) sa_bp_offer(m, sym, heap, &size, prev[left], left);
        if (next[left] < n) sa_bp_offer(m, sym, heap, &size, left, next[left]);
    }
    int64_t k = 0;
    for (int32_t i = 0; i < n; i = next[i]) out[k++] = sym[i];
    return k;
}

static inline int sa_bp_crlf(uint32_t c) { return c == '\r' || c == '\n'; }

/* The end of the piece that starts at code point i of cp[0:n] (the regular expression above). */
static int64_t sa_bp_piece(const sa_bytepair *m, const uint32_t *cp, int64_t n, int64_t i) {
    const uint8_t *f = m->flags;
    uint32_t c = cp[i];
#define SA_BP_IS(k, flag) ((k) < n && (f[cp[k]] & (flag)))
#define SA_BP_OTHER(k) ((k) < n && !(f[cp[k]] & (SA_BP_LETTER | SA_BP_NUMBER | SA_BP_SPACE)))
    if (c == '\'' && i + 1 < n) {
        uint32_t a = cp[i + 1] | 0x20, b = i + 2 < n ? cp[i + 2] | 0x20 : 0;
        int ascii_a = cp[i + 1] < 128, ascii_b = i + 2 < n && cp[i + 2] < 128;
        if (ascii_a && (a == 's' || a == 't' || a == 'm' || a == 'd')) return i + 2;
        if (ascii_a && ascii_b && ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')))
            return i + 3;
    }
    int64_t j = i;
    if (f[c] & SA_BP_LETTER || (!sa_bp_crlf(c) && !(f[c] & SA_BP_NUMBER) && SA_BP_IS(i + 1, SA_BP_LETTER))) {
        j = (f[c] & SA_BP_LETTER) ? i + 1 : i + 2;
        while (SA_BP_IS(j, SA_BP_LETTER)) j++;
        return j;
    }
    if (f[c] & SA_BP_NUMBER) {
        for (j = i + 1; j - i < m->digits && SA_BP_IS(j, SA_BP_NUMBER); j++) {}
        return j;
    }
    if (SA_BP_OTHER(i) || (c == ' ' && SA_BP_OTHER(i + 1))) {
        for (j = c == ' ' ? i + 1 : i; SA_BP_OTHER(j); j++) {}
        while (j < n && sa_bp_crlf(cp[j])) j++;
        return j;
    }
    for (j = i; SA_BP_IS(j, SA_BP_SPACE); j++) {}  /* c is a space: [i, j) the run */
    for (int64_t k = j - 1; k >= i; k--)
        if (sa_bp_crlf(cp[k])) return k + 1;  /* \s*[\r\n]+ */
    if (j == n || j - i == 1) return j;        /* \s+(?!\S) to the end, or \s+ */
    return j - 1;                              /* \s+(?!\S): the last space stays for the next piece */
#undef SA_BP_IS
#undef SA_BP_OTHER
}

/* text[0:n] -> out (room for n ids); -> the number of ids, or -1 when out of memory. */
static int64_t sa_bytepair_encode(const sa_bytepair *m, const uint8_t *text, int64_t n, int32_t *out) {
    uint32_t *cp = malloc((size_t)(n + 1) * sizeof(uint32_t));
    int64_t *at = malloc((size_t)(n + 1) * sizeof(int64_t));  /* code point k starts at byte at[k] */
    int32_t cap = 0, *sym = NULL;
    sa_bp_entry *heap = NULL;
    int64_t count = 0, k = 0;
    if (!cp || !at) goto oom;
    for (int64_t b = 0; b < n; k++) {  /* valid UTF-8 */
        uint8_t c = text[b];
        int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        for (int t = 1; t < len && b + t < n; t++) v = v << 6 | (text[b + t] & 0x3F);
        cp[k] = v < SA_BP_CODEPOINTS ? v : 0xFFFD;
        at[k] = b;
        b += len;
    }
    at[k] = n;
    for (int64_t i = 0; i < k;) {
        int64_t j = sa_bp_piece(m, cp, k, i);
        const uint8_t *s = text + at[i];
        int64_t len = at[j] - at[i];
        int32_t id = len == 1 ? m->byte_id[s[0]] : m->ignore_merges ? sa_bp_token(m, s, len) : -1;
        if (id >= 0) {
            out[count++] = id;
        } else {
            if (len > cap) {
                int32_t c2 = (int32_t)(len > 2 * (int64_t)cap ? len : 2 * (int64_t)cap);
                free(sym); free(heap);
                sym = malloc((size_t)c2 * 3 * sizeof(int32_t));
                heap = malloc((size_t)c2 * 3 * sizeof(sa_bp_entry));
                if (!sym || !heap) goto oom;
                cap = c2;
            }
            count += sa_bp_merge(m, s, (int32_t)len, out + count, sym, sym + cap, sym + 2 * cap, heap);
        }
        i = j;
    }
    free(cp); free(at); free(sym); free(heap);
    return count;
oom:
    free(cp); free(at); free(sym); free(heap);
    return -1;
}
