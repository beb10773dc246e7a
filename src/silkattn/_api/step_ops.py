"""The fused decoder step's bookkeeping: layer_step_record builds and checks a record
(silkattn._step), layer_step and layer_step_rows run it, or its ops fallback where a backend has
no fused kernel."""
import dataclasses

import numpy as np
from numpy.lib.array_utils import byte_bounds

from .. import _cache, quant
from .. import _checks as check
from .. import _step as _step_mod
from .._threads import LINEAR_WORK, threads_for
from ..quant import QuantizedMatrix
from .attention_ops import attention
from .norm_ops import layer_norm, rms_norm
from .product_ops import linear
from .row_ops import gate_mul, rope_tables

# ---------------------------------------------------------------- layer_step

_F32 = np.dtype(np.float32)


def _read_only(a):
    """a read-only view of a (what a record only reads)."""
    v = a.view()
    v.flags.writeable = False
    return v


_EMPTY = _read_only(np.zeros(0, np.float32))


def _step_array(a, name, shape, dtype=_F32, writeable=False):
    """a as a C-contiguous ndarray of `dtype` and `shape`, or a TypeError or ValueError naming it."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of {np.dtype(dtype)}, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{name} must be {np.dtype(dtype)} (the fused step's dtype), got {a.dtype}")
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} must be writeable (the step writes it)")
    return a if writeable else _read_only(a)


def _step_norm(norm, name, d):
    """A Norm from g (RMSNorm) or (g, b) (LayerNorm)."""
    g, b = norm if isinstance(norm, tuple) and len(norm) == 2 else (norm, None)
    return _step_mod.Norm(_step_array(g, f"{name}'s gain", (d,)),
                          _EMPTY if b is None else _step_array(b, f"{name}'s bias", (d,)))


def _step_shape(W, name):
    """(k, n) of a product's matrix (W, or (W, b)): a float32 array or a QuantizedMatrix."""
    W = W[0] if isinstance(W, tuple) and len(W) == 2 else W
    if isinstance(W, list):  # parts side by side
        if not W:
            raise ValueError(f"{name} must be one matrix or a list of its parts side by side, got an "
                             "empty list")
        shapes = [_step_shape(P, f"{name}'s part {i}") for i, P in enumerate(W)]
        if len({k for k, _ in shapes}) > 1:
            raise ValueError(f"{name}'s parts must have one input width, got {shapes}")
        return shapes[0][0], sum(n for _, n in shapes)
    if isinstance(W, QuantizedMatrix):
        return W.shape
    if not isinstance(W, np.ndarray) or W.ndim != 2:
        raise TypeError(f"{name} must be a float32 (in, out) matrix or a QuantizedMatrix (or one with its "
                        f"bias, (W, b)), got {type(W).__name__} {getattr(W, 'shape', '')}")
    return W.shape


def _step_product(W, name, k, n):
    """A Product from a float32 (k, n) array or a QuantizedMatrix standing for one, or (W, b)."""
    W, b = W if isinstance(W, tuple) and len(W) == 2 else (W, None)
    if _step_shape(W, name) != (k, n):
        raise ValueError(f"{name} must stand for a ({k}, {n}) matrix, got {_step_shape(W, name)}")
    if isinstance(W, QuantizedMatrix):
        w, kind, matrix = _read_only(W.blocks), W.code, W
    else:
        w, kind, matrix = _step_array(W, name, (k, n)), _step_mod.DENSE, None
    return _step_mod.Product(w, kind, k, n, _EMPTY if b is None else _step_array(b, f"{name}'s bias", (n,)),
                             matrix)


KV_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))  # a fused step's cache: float32, or float16


def _step_cache(cache, h_kv, dh):
    """(K, V, head_stride, row_stride, capacity) of a layer's cache (K, V): each (h_kv, capacity, dh)
    (Llama's) or (capacity, h_kv dh) (the listing's, heads side by side), both float32 or both
    float16."""
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        raise TypeError(f"cache must be a layer's (K, V), got {type(cache).__name__}")
    K, V = cache
    shape = getattr(K, "shape", None)
    if shape is not None and len(shape) == 3 and shape[0] == h_kv and shape[2] == dh:
        capacity, strides = shape[1], (shape[1] * dh, dh)
    elif shape is not None and len(shape) == 2 and shape[1] == h_kv * dh:
        capacity, strides = shape[0], (dh, h_kv * dh)
    else:
        raise ValueError(f"cache's K must be ({h_kv}, capacity, {dh}) or (capacity, {h_kv * dh}), "
                         f"got {shape}")
    if capacity < 1:
        raise ValueError("cache must hold at least one position")
    dtype = getattr(K, "dtype", None)
    if dtype not in KV_DTYPES:
        raise TypeError(f"cache's K must be float32 or float16, got {dtype}")
    K, V = (_step_array(a, f"cache's {n}", shape, dtype, writeable=True) for a, n in ((K, "K"), (V, "V")))
    if np.shares_memory(K, V):
        raise ValueError("cache's K and V must not overlap")
    return K, V, *strides, capacity


def _step_scratch(scratch_of, sizes):
    """The step's buffers: scratch_of's (a LayerStep of the same sizes, its scores' rows at least as
    long: a model's layers share them, a ring's shorter cache among them), or new ones."""
    if scratch_of is not None:
        if not isinstance(scratch_of, _step_mod.LayerStep):
            raise TypeError(f"scratch_of must be a LayerStep, got {type(scratch_of).__name__}")
        shapes = tuple(a.shape for a in scratch_of.scratch.arrays)
        if shapes[:-1] != sizes[:-1] or shapes[-1][0] != sizes[-1][0] or shapes[-1][1] < sizes[-1][1]:
            raise ValueError("scratch_of's buffers are not this step's sizes: share them between the layers "
                             "of one model, the one with the longest cache made first")
        return scratch_of.scratch
    return _step_mod.Scratch(*(np.empty(size, np.float32) for size in sizes))


def layer_step_record(*, heads, norm1, qkv, o, norm2, up, down, cache, eps, kv_heads=None,
                      activation="relu", post_norm=False, rope_base=None, freq_factors=None, cross=None,
                      scratch_of=None, qk_norm=None, post_norms=None, window=None, positions=None,
                      scale=None):
    """The LayerStep of one decoder layer (silkattn._step: the fields and the arithmetic), checked
    once: each argument's shape against the others, a TypeError or ValueError naming the first that
    does not fit. See silkattn.ops.layer_step_record for the arguments."""
    h = check.count(heads, "heads")
    h_kv = h if kv_heads is None else check.count(kv_heads, "kv_heads")
    if h % h_kv:
        raise ValueError(f"heads={h} must be a multiple of kv_heads={h_kv} (grouped-query attention)")
    if activation not in _step_mod.GATES:
        raise ValueError(f"activation must be one of {', '.join(map(repr, _step_mod.GATES))}, "
                         f"got {activation!r}")
    gate = _step_mod.GATES[activation]
    (hd, d), d_in = _step_shape(o, "o"), _step_shape(qkv, "qkv")[0]
    if hd % h or d_in != d:
        raise ValueError(f"o must be (heads x head width, d) and qkv (d, ...): got o {(hd, d)} for {h} heads "
                         f"and qkv's input {d_in}")
    dh = hd // h
    n_up = _step_shape(up, "up")[1]
    dff = n_up // 2 if gate else n_up
    if gate and n_up % 2:
        raise ValueError(f"up must have an even number of outputs for {activation} (gate | up), got {n_up}")
    q8 = _step_q8((qkv, o, up, down) + ((cross.get("q"), cross.get("o")) if hasattr(cross, "get") else ()))
    qkv, o = _step_parts(qkv, "qkv", d, (h + 2 * h_kv) * dh, 3), _step_product(o, "o", h * dh, d)
    up, down = _step_parts(up, "up", d, n_up, 2), _step_product(down, "down", dff, d)
    norm1, norm2 = _step_norm(norm1, "norm1", d), _step_norm(norm2, "norm2", d)
    q_norm, k_norm = _step_rms_pair(qk_norm, "qk_norm", dh)
    post1, post2 = _step_rms_pair(post_norms, "post_norms", d)
    if post_norm and post1.g.size:
        raise ValueError("post_norms (sandwich norms) go with the pre-norm placement, not post_norm")
    K, V, head_stride, row_stride, capacity = _step_cache(cache, h_kv, dh)
    window = 0 if window is None else check.count(window, "window")
    ring = bool(window) and capacity == window
    positions = capacity if positions is None else check.count(positions, "positions")
    if positions != capacity and not ring:
        raise ValueError(f"positions={positions} differs from the cache's {capacity}: only a ring (a "
                         f"cache of window={window or None} positions) holds fewer rows than positions")
    cos, sin = _step_rope(rope_base, freq_factors, dh, positions)
    memory = _step_cross(cross, h, h_kv, dh, d)
    products = qkv + (o,) + up + (down,) + ((memory[1], memory[2]) if cross is not None else ())
    if any(W.b.size for W in (o, down, memory[2]) if W.kind != _step_mod.DENSE):
        raise ValueError("o, down and cross's o add the residual: as GGUF block products they take no bias "
                         "of their own")
    norms = (norm1, norm2) + ((memory[0],) if cross is not None else ())
    eps = (check.positive if all(not N.b.size for N in norms) else check.nonnegative)(eps, "eps")
    scale = 1 / np.sqrt(dh) if scale is None else check.positive(scale, "scale")
    n_src = len(memory[3])
    sizes = (((h + 2 * h_kv) * dh,), (h * dh,), (max(d, dff),), (max(n_up, d),), (h, max(capacity, n_src)))
    return _step_mod.LayerStep(
        d=d, h=h, h_kv=h_kv, dh=dh, eps=eps, post_norm=bool(post_norm), gate=gate, q8=q8,
        norm1=norm1, qkv=qkv, o=o, norm2=norm2, up=up, down=down, q_norm=q_norm, k_norm=k_norm, post1=post1,
        post2=post2, scale=float(scale), window=window, ring=ring, positions=positions, K=K, V=V,
        head_stride=head_stride, row_stride=row_stride, capacity=capacity, cos=cos, sin=sin,
        has_cross=cross is not None, norm_cross=memory[0], cross_q=memory[1], cross_o=memory[2],
        Km=memory[3], Vm=memory[4], keep=memory[5], scratch=_step_scratch(scratch_of, sizes),
        work=sum(W.k * W.n for W in products))


def _step_rope(rope_base, freq_factors, dh, positions):
    """The rotary tables (positions, dh / 2) of rope_base, or empty ones (no rotary)."""
    if rope_base is None:
        if freq_factors is not None:
            raise ValueError("freq_factors needs rope_base (they divide its frequencies)")
        return _EMPTY.reshape(0, 0), _EMPTY.reshape(0, 0)
    if dh % 2:
        raise ValueError(f"rope_base needs an even head width, got {dh}")
    cos, sin, _ = rope_tables(check.positive(rope_base, "rope_base"), dh // 2, _F32, np.arange(positions),
                              check.freq_factors(freq_factors, dh // 2))
    return cos, sin


def _step_rms_pair(pair, name, n):
    """Two RMSNorm gains of n (a pair of norms: QK-norm, sandwich norms), or empty Norms for None."""
    if pair is None:
        return _NO_NORM, _NO_NORM
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
        raise TypeError(f"{name} must be a pair of RMSNorm gains or None, got {type(pair).__name__}")
    return tuple(_step_mod.Norm(_step_array(g, f"{name}[{i}]", (n,)), _EMPTY) for i, g in enumerate(pair))


def _step_parts(W, name, k, n, most):
    """The Products of a matrix given whole (W or (W, b)) or as a list of parts side by side ([W1,
    W2, ...] or ([W1, W2, ...], b)): parts whose blocks differ in type, each multiplied as it is."""
    W, b = W if isinstance(W, tuple) and len(W) == 2 else (W, None)
    parts = list(W) if isinstance(W, list) else [W]
    if not 1 <= len(parts) <= most:
        raise ValueError(f"{name} must be one matrix or a list of 1 to {most} parts, got {len(parts)}")
    widths = [_step_shape(P, f"{name}'s part {i}")[1] for i, P in enumerate(parts)]
    if sum(widths) != n:
        raise ValueError(f"{name}'s parts must stand for a ({k}, {n}) matrix, got outputs {widths}")
    b = None if b is None else _step_array(b, f"{name}'s bias", (n,))
    edges = np.cumsum([0] + widths)
    out = tuple(_step_product(P if b is None else (P, np.ascontiguousarray(b[lo:hi])), f"{name}'s part {i}",
                              k, hi - lo) for i, (P, lo, hi) in enumerate(zip(parts, edges, edges[1:])))
    if len({P.kind == _step_mod.DENSE for P in out}) > 1:
        raise ValueError(f"{name}'s parts must be all float32 or all GGUF blocks")
    return out


_NO_PRODUCT = _step_mod.Product(_EMPTY.reshape(0, 0), _step_mod.DENSE, 0, 0, _EMPTY)
_NO_NORM = _step_mod.Norm(_EMPTY, _EMPTY)
_NO_CROSS = (_NO_NORM, _NO_PRODUCT, _NO_PRODUCT, _EMPTY.reshape(0, 0),
             _EMPTY.reshape(0, 0), _read_only(np.zeros(0, np.uint8)))


def _step_cross(cross, h, h_kv, dh, d):
    """(norm, q, o, Km, Vm, keep) of the cross-attention: cross = {"norm", "q", "o", "memory": (Km, Vm),
    "keep": (n_src,) or None}, the memory (n_src, d) with heads side by side; or placeholders."""
    if cross is None:
        return _NO_CROSS
    if not hasattr(cross, "keys"):
        raise TypeError(f"cross must be a dict (norm, q, o, memory, keep) or None, "
                        f"got {type(cross).__name__}")
    missing = [k for k in ("norm", "q", "o", "memory") if k not in cross]
    if missing:
        raise ValueError(f"cross lacks {', '.join(missing)}: the cross-attention's norm, q, o and memory "
                         "(K, V)")
    if h_kv != h or h * dh != d:
        raise ValueError(f"cross-attention takes heads of d / heads over the memory: got {h} heads of {dh}, "
                         f"{h_kv} K/V heads and d = {d}")
    Km, Vm = cross["memory"]
    n_src = getattr(Km, "shape", (0,))[0]
    if n_src < 1:
        raise ValueError("cross's memory must hold at least one key")
    Km, Vm = (_step_array(a, f"cross's memory {n}", (n_src, d)) for a, n in ((Km, "K"), (Vm, "V")))
    keep = cross.get("keep")
    keep = np.ones(n_src, np.uint8) if keep is None else np.asarray(keep)
    if keep.shape != (n_src,) or keep.dtype.kind not in "biu":
        raise ValueError(f"cross's keep must be a ({n_src},) boolean mask of the memory's keys, "
                         f"got {keep.dtype} {keep.shape}")
    return (_step_norm(cross["norm"], "cross's norm", d), _step_product(cross["q"], "cross's q", d, d),
            _step_product(cross["o"], "cross's o", d, d), Km, Vm, _read_only((keep != 0).astype(np.uint8)))


def _step_q8(matrices):
    """Whether the block products round their input to 8 bits: the QuantizedMatrices' activations,
    one kind for all of a step's."""
    matrices = [W[0] if isinstance(W, tuple) else W for W in matrices]
    matrices = [P for W in matrices for P in (W if isinstance(W, list) else [W])]
    activations = {W.activations for W in matrices if isinstance(W, QuantizedMatrix)}
    if len(activations) > 1:
        raise ValueError(f"a step's QuantizedMatrices take one kind of activations, "
                         f"got {sorted(activations)}")
    return activations == {"int8"}


def layer_step(kernels, step, x, pos):
    """x (d,) float32 through one layer at position pos, in place (silkattn._step's arithmetic):
    Kernels.layer_step, or where the backend has none the same step as separate ops."""
    if not isinstance(step, _step_mod.LayerStep):
        raise TypeError(f"step must be a LayerStep (silkattn.ops.layer_step_record), "
                        f"got {type(step).__name__}")
    if type(x) is not np.ndarray or x.dtype != _F32 or x.shape != (step.d,) \
            or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(f"x must be a writeable C-contiguous float32 array of shape ({step.d},) (the "
                         f"residual row, updated in place), got {type(x).__name__} {getattr(x, 'dtype', '')} "
                         f"{getattr(x, 'shape', '')}")
    pos = check.count(pos, "pos", minimum=0)
    if pos >= step.positions:
        raise ValueError(f"pos={pos} is past the {step.positions} positions the step was made for"
                         + ("" if step.ring else " (the cache's)"))
    if step.prepared.get("x") is not x:  # the last row seen passed
        written = step.prepared.get("written")
        if written is None:  # the byte ranges of what the step writes (C-contiguous arrays)
            written = step.prepared["written"] = [(_address(a), _address(a) + a.nbytes)
                                                  for a in (step.K, step.V, *step.scratch.arrays)]
        lo = _address(x)
        if any(lo < hi and a < lo + x.nbytes for a, hi in written):
            raise ValueError("x must not overlap the step's cache or scratch")
        step.prepared["x"] = x
    if kernels.layer_step is None:
        _layer_step_ops(kernels, step, x, pos)
    else:
        kernels.layer_step(step, x, pos, threads_for(step.work, LINEAR_WORK))
    return x


def _address(a):
    return a.__array_interface__["data"][0]


def layer_step_rows(kernels, step, X, positions, K_pages, V_pages, pages):
    """X (m, d) through one layer in place, or through the layers of a list of records in turn
    (K_pages and V_pages then lists of their pools, one pair a record), row r at positions[r] over
    page pages[r] of the pools (ops.layer_step_rows): one Kernels.layer_step_rows call for all the
    layers, or each row through the ops over its page."""
    if isinstance(step, _step_mod.LayerStep):
        steps, Ks, Vs = [step], [K_pages], [V_pages]
    elif isinstance(step, (list, tuple)) and isinstance(K_pages, (list, tuple)) \
            and isinstance(V_pages, (list, tuple)):
        steps, Ks, Vs = list(step), list(K_pages), list(V_pages)
        if not steps or len(Ks) != len(steps) or len(Vs) != len(steps):
            raise ValueError(f"K_pages and V_pages must be lists of one pool a record ({len(steps)} "
                             f"records), got {len(Ks)} and {len(Vs)}")
    else:
        raise TypeError(f"step must be a LayerStep (silkattn.ops.layer_step_record) or a list of them "
                        f"(K_pages and V_pages then lists too), got {type(step).__name__}")
    for L in steps:
        if not isinstance(L, _step_mod.LayerStep):
            raise TypeError(f"step must be a LayerStep (silkattn.ops.layer_step_record), got "
                            f"{type(L).__name__}")
    d = steps[0].d
    if type(X) is not np.ndarray or X.dtype != _F32 or X.ndim != 2 or X.shape[1] != d \
            or not X.flags.c_contiguous or not X.flags.writeable:
        raise ValueError(f"X must be a writeable C-contiguous float32 array of shape (rows, {d}), got "
                         f"{type(X).__name__} {getattr(X, 'dtype', '')} {getattr(X, 'shape', '')}")
    positions, pages = _index_rows(positions, "positions", len(X)), _index_rows(pages, "pages", len(X))
    rows, last, x_at = [], None, _address(X)
    for L, K, V in zip(steps, Ks, Vs):
        rows.append(_layer_rows(L, X, x_at, positions, K, V, pages, last))
        last = L, rows[-1]
    if kernels.layer_step_rows is None:
        for L, K, V, (positions_, pages_, *_) in zip(steps, Ks, Vs, rows):
            _layer_step_rows_ops(kernels, L, X, positions_, K, V, pages_)
        return X
    kernels.layer_step_rows(steps, X, [r[2] for r in rows], [K.reshape(-1) for K in Ks],
                            [V.reshape(-1) for V in Vs], [r[3] for r in rows], [r[4] for r in rows],
                            threads_for(max(L.work for L in steps), LINEAR_WORK))
    return X


def _layer_rows(step, X, x_at, positions, K_pages, V_pages, pages, last):  # -> positions, pages, at, cos, sin
    """One record's part of layer_step_rows, checked (x_at: X's address; positions, pages: int64 (m,);
    last: the previous record and its result, whose rows are taken again where its keys and rotary
    tables are the same: each layer of a model's step would give the same ones)."""
    if step.d != X.shape[1] or not step.prepared.get("rows_record"):  # the record's kind: checked once
        if step.post_norm or step.has_cross or not step.gated or step.d != X.shape[1] \
                or any(P.kind == _step_mod.DENSE for P in step.products):
            raise ValueError("step must be a Llama-family layer's record (block products, pre-norm, a "
                             "gated feed-forward, no cross-attention; all of X's width) for layer_step_rows")
        step.prepared["rows_record"] = True
    page_shape = (step.h_kv, step.capacity, step.dh)
    for name, a in (("K_pages", K_pages), ("V_pages", V_pages)):
        if type(a) is not np.ndarray or a.dtype != step.K.dtype or a.ndim != 4 or a.shape[1:] != page_shape \
                or not a.flags.c_contiguous or not a.flags.writeable \
                or (step.head_stride, step.row_stride) != (step.capacity * step.dh, step.dh):
            raise ValueError(f"{name} must be a writeable C-contiguous {step.K.dtype} array (n_pages, "
                             f"{', '.join(map(str, page_shape))}) of caches laid out as the record's, got "
                             f"{getattr(a, 'dtype', '')} {getattr(a, 'shape', type(a).__name__)}")
    if K_pages.shape != V_pages.shape:
        raise ValueError(f"V_pages must have K_pages' shape {K_pages.shape}, got {V_pages.shape}")
    if last is not None and _rows_key(last[0]) == _rows_key(step) and len(K_pages) == last[1][5]:
        same = last[0].cos is step.cos and last[0].sin is step.sin
        positions, pages, at, cos, sin, _ = last[1]
        if not same:
            cos, sin = _rotary_rows(step, positions)
    else:
        positions, pages, at, cos, sin = _rows_of(step, positions, pages, len(X), len(K_pages))
    # X's bytes against the pools' and the scratch's (X, K and V are contiguous: a range each; every
    # step's X is a new array, so this is a step's cost: numpy's may_share_memory took 0.3 ms of it)
    spans = step.prepared.get("rows_scratch")
    if spans is None:
        spans = step.prepared["rows_scratch"] = [byte_bounds(a) for a in step.scratch.arrays]
    k_at, v_at, x_end = _address(K_pages), _address(V_pages), x_at + X.nbytes
    if any(lo < x_end and x_at < hi for lo, hi in (*spans, (k_at, k_at + K_pages.nbytes),
                                                   (v_at, v_at + V_pages.nbytes))):
        raise ValueError("X must not overlap the pools or the step's scratch")
    return positions, pages, at, cos, sin, len(K_pages)


def _rows_key(step):  # what a record's rows (_rows_of's at) depend on besides the positions and pages
    return step.positions, step.ring, step.window, step.capacity, step.h_kv, step.dh


_NO_ROWS = np.zeros((0, 1), np.float32)


def _rows_of(step, positions, pages, m, n_pages):  # -> positions, pages, at (m, 4), cos, sin
    """layer_step_rows' checked rows (int64 (m,) each) and what the kernel reads of them: at[r] = the
    cache row of positions[r], the first row its query sees, the rows seen, and its page's first
    element; cos, sin: its rotary rows. The checks and at are kept by value (silkattn._cache,
    read-only): a batch's steps come back to the same rows."""
    key = ("layer_step_rows", positions.tobytes(), pages.tobytes(), n_pages, *_rows_key(step))
    positions, pages, at = _cache.get(key, lambda: _checked_rows(step, positions, pages, m, n_pages))
    return (positions, pages, at, *_rotary_rows(step, positions))


def _rotary_rows(step, positions):  # -> cos, sin (m, dh / 2): the record's rotary rows of the positions
    rope = step.cos.size != 0
    return tuple(t[positions] if rope else _NO_ROWS for t in (step.cos, step.sin))


def _checked_rows(step, positions, pages, m, n_pages):  # -> positions, pages, at: read-only copies
    if m and (positions.min() < 0 or positions.max() >= step.positions):
        raise ValueError(f"positions must lie in 0 .. {step.positions - 1} (the record's), got {positions}")
    if m and (pages.min() < 0 or pages.max() >= n_pages):
        raise ValueError(f"pages must name pages of the pools' {n_pages}, got {pages}")
    if len(np.unique(pages)) != m:
        raise ValueError(f"pages must be distinct (each row a sequence over a cache of its own), got {pages}")
    page_at = pages * (step.h_kv * step.capacity * step.dh)  # elements to each row's page
    rows = (positions.copy(), pages.copy(), np.concatenate([step.keys_rows(positions), page_at[:, None]], 1))
    for a in rows:  # shared by the calls that hit
        a.flags.writeable = False
    return rows


def _index_rows(a, name, m):  # -> int64 (m,): one integer a row
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {a.dtype}")
    if a.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},), one a row of X, got {a.shape}")
    return a.astype(np.int64, copy=False)


def _record_norm(kernels, L, N, v):  # a record's norm of v (..., d)
    return layer_norm(kernels, v, N.g, N.b, L.eps) if N.b.size else rms_norm(kernels, v, N.g, L.eps)


def _record_product(kernels, L, P, v):  # v (..., k) through a record's product, or its parts side by side
    if isinstance(P, tuple):
        return np.concatenate([_record_product(kernels, L, part, v) for part in P], -1)
    W = P.w if P.kind == _step_mod.DENSE else QuantizedMatrix(quant.KINDS[P.kind], P.w,
                                                              "int8" if L.q8 else "float32")
    return linear(kernels, v, W, P.b if P.b.size else None)


def _layer_step_rows_ops(kernels, L, X, positions, K_pages, V_pages, pages):
    """layer_step_rows as ops (a backend without the fused kernel), X in place: each product one
    call for all the rows, each row's heads and attention over its own page (_step_attention)."""
    own = [dataclasses.replace(L, K=K_pages[p], V=V_pages[p], prepared={}) for p in pages]

    def sublayer(f, N, post):
        F = f(_record_norm(kernels, L, N, X))
        X[:] = X + (rms_norm(kernels, F, post.g, L.eps) if post.g.size else F)

    def attend(v):
        qkv = _record_product(kernels, L, L.qkv, v)
        return np.stack([_step_attention(kernels, R, q, int(p)) for R, q, p in zip(own, qkv, positions)])

    def ffn(v):
        u = _record_product(kernels, L, L.up, v)
        act = "silu" if L.gate == _step_mod.GATE_SILU else "gelu_tanh"
        return _record_product(kernels, L, L.down, gate_mul(kernels, u[:, :L.d_ff], u[:, L.d_ff:], act))
    sublayer(lambda v: _record_product(kernels, L, L.o, attend(v)), L.norm1, L.post1)
    sublayer(ffn, L.norm2, L.post2)


def _layer_step_ops(kernels, L, x, pos):
    """layer_step as the separate ops of `kernels` (a backend without the fused kernel), x in place."""
    def norm(N, v):
        return _record_norm(kernels, L, N, v)

    def product(P, v):
        return _record_product(kernels, L, P, v)

    def sublayer(f, N, post=_NO_NORM):
        if L.post_norm:
            x[:] = norm(N, x + f(x))
        else:
            F = f(norm(N, x))
            x[:] = x + (norm(post, F) if post.g.size else F)

    sublayer(lambda v: product(L.o, _step_attention(kernels, L, product(L.qkv, v), pos)), L.norm1, L.post1)
    if L.has_cross:
        sublayer(lambda v: product(L.cross_o, _step_attention(kernels, L, product(L.cross_q, v), None)),
                 L.norm_cross)

    def ffn(v):
        u = product(L.up, v)
        if not L.gated:
            return product(L.down, np.maximum(u, 0))
        act = "silu" if L.gate == _step_mod.GATE_SILU else "gelu_tanh"
        return product(L.down, gate_mul(kernels, u[:L.d_ff], u[L.d_ff:], act))
    sublayer(ffn, L.norm2, L.post2)


def _step_attention(kernels, L, qkv, pos):
    """The attention of _layer_step_ops: self-attention of the token at pos (QK-norm, rotary, its
    cache row written, the rows it sees read), or (pos None) the cross-attention over the memory."""
    h, h_kv, dh = L.h, L.h_kv, L.dh
    heads = qkv.reshape(-1, dh)
    if pos is None:
        Km, Vm = (a.reshape(-1, h, dh).swapaxes(0, 1) for a in (L.Km, L.Vm))
        a = attention(kernels, heads[:, None], Km, Vm, L.keep.astype(bool), scale=L.scale)
        return a.reshape(-1)
    if L.q_norm.g.size:
        heads[:h] = rms_norm(kernels, heads[:h], L.q_norm.g, L.eps)
        heads[h:h + h_kv] = rms_norm(kernels, heads[h:h + h_kv], L.k_norm.g, L.eps)
    if L.cos.size:  # reference.rope's arithmetic on the tables' row
        c, s, half = L.cos[pos], L.sin[pos], dh // 2
        x1, x2 = heads[:h + h_kv, :half].copy(), heads[:h + h_kv, half:].copy()
        heads[:h + h_kv, :half], heads[:h + h_kv, half:] = x1 * c - x2 * s, x2 * c + x1 * s
    item = L.K.itemsize
    strides = (L.head_stride * item, L.row_stride * item, item)
    K, V = (np.lib.stride_tricks.as_strided(a, (h_kv, L.capacity, dh), strides) for a in (L.K, L.V))
    row, lo, n = L.keys(pos)
    K[:, row], V[:, row] = heads[h:h + h_kv], heads[h + h_kv:]  # a float16 cache: rounded to nearest even
    q = heads[:h].reshape(h_kv, h // h_kv, dh)  # a group's query heads: the rows of its K/V head's attention
    K, V = (a[:, lo:lo + n].astype(np.float32, copy=False) for a in (K, V))  # float16 widened exactly
    return attention(kernels, q, K, V, scale=L.scale).reshape(-1)
