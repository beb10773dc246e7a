"""The Numba kernels' source run as plain Python (NUMBA_DISABLE_JIT=1) against the reference.

Compiled, the kernels are checked by the shared suite; this runs a few small cases through the
same source interpreted (the SIMD intrinsics become NumPy stand-ins), in a subprocess because the
flag is read when numba is first imported.
"""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

SCRIPT = textwrap.dedent("""
    import numba
    import numpy as np
    assert numba.config.DISABLE_JIT
    import silkattn
    import silkattn.numba as sn
    from silkattn import reference as ref

    from silkattn._testing import TOL
    rng = np.random.default_rng(4)
    silkattn.set_num_threads(2)
    for dtype in (np.float32, np.float64):
        f64 = lambda *a: [x.astype(np.float64) for x in a]
        # several query and key tiles (BQ = BK = 64), d_k and d_v not multiples of a register
        Q = rng.standard_normal((2, 70, 20)).astype(dtype)
        K = rng.standard_normal((2, 150, 20)).astype(dtype)
        V = rng.standard_normal((2, 150, 12)).astype(dtype)
        mask = rng.random((2, 70, 150)) < 0.7
        mask[:, ::5] = False                  # fully masked rows: mean(V)
        mask[:, :, 10:140] &= rng.random((2, 70, 1)) < 0.5
        cases = [(None, False, 0), (None, True, 0), (mask, False, 0), (mask, True, 0), (None, True, 63)]
        for m, causal, off in cases:
            tri = ref.causal_mask(70, 150, off)
            full = tri if causal and m is None else (m & tri if causal else m)
            np.testing.assert_allclose(sn.attention(Q, K, V, m, causal=causal, q_offset=off),
                                       ref.attention(*f64(Q, K, V), full), **TOL[np.dtype(dtype)])
        # one query row: the decode path (keys in chunks of 256: 300 keys make two)
        Kd = rng.standard_normal((2, 300, 20)).astype(dtype)
        Vd = rng.standard_normal((2, 300, 12)).astype(dtype)
        pad = np.arange(300) < np.array([300, 7])[:, None, None]
        for m, off in ((None, 299), (pad, 299), (None, 100)):
            full = ref.causal_mask(1, 300, off) if m is None else m & ref.causal_mask(1, 300, off)
            np.testing.assert_allclose(sn.attention(Q[:, :1], Kd, Vd, m, causal=True, q_offset=off),
                                       ref.attention(*f64(Q[:, :1], Kd, Vd), full), **TOL[np.dtype(dtype)])
        x = (rng.standard_normal((5, 13)) * 4).astype(dtype)
        x[1] = -1e9
        np.testing.assert_allclose(sn.softmax(x), ref.softmax(*f64(x)), **TOL[np.dtype(dtype)])
        X = (1e3 + rng.standard_normal((4, 37))).astype(dtype)
        g, b = rng.standard_normal(37).astype(dtype), rng.standard_normal(37).astype(dtype)
        np.testing.assert_allclose(sn.layer_norm(X, g, b), ref.layer_norm(*f64(X, g, b)),
                                   **TOL[np.dtype(dtype)])
        # the Llama family's ops: rows with a tail, strided views in place
        np.testing.assert_allclose(sn.rms_norm(X, g), ref.rms_norm(*f64(X, g)), **TOL[np.dtype(dtype)])
        S, Y = sn.add_rms_norm(X, X[::-1], g)
        np.testing.assert_allclose(Y, ref.rms_norm(*f64(X + X[::-1], g)), **TOL[np.dtype(dtype)])
        qkv = rng.standard_normal((3, 120)).astype(dtype)
        q = qkv[:, :90].reshape(3, 3, 30).swapaxes(0, 1)  # 3 heads of d_head 30: half 15, a tail
        expected = ref.rope(q, [4, 5, 6])
        sn.rope(q, [4, 5, 6], out=q)
        np.testing.assert_array_equal(q, expected)
        H = (rng.standard_normal((4, 74)) * 4).astype(dtype)
        expected = ref.silu(H[:, :37].astype(np.float64)) * H[:, 37:]
        sn.silu_mul(H[:, :37], H[:, 37:], out=H[:, :37])
        np.testing.assert_allclose(H[:, :37], expected, **TOL[np.dtype(dtype)])
        if dtype == np.float32:  # linear with W as GGUF blocks (float32 only, as its kernel)
            from silkattn.quant import QuantizedMatrix
            for kind, size in ref.QUANT_BYTES.items():
                blocks = rng.integers(0, 256, (20, 3 * size), dtype=np.uint8)
                halves = blocks.reshape(20, 3, size)[..., :4 if kind == "Q4_1" else 2].view(np.uint16)
                halves &= 0xBBFF  # finite scales below 2
                W = QuantizedMatrix(kind, blocks)
                Xq = rng.standard_normal((3, 96)).astype(dtype)
                bq = rng.standard_normal(20).astype(dtype)
                W64 = W.dequantize().astype(np.float64)
                M = np.abs(Xq.astype(np.float64)) @ (np.abs(W64) + 16) + np.abs(bq)
                err = np.abs(sn.linear(Xq, W, bq) - (Xq.astype(np.float64) @ W64 + bq))
                assert (err <= 1e-5 * M).all(), (kind, err.max())
            # the fused layer step, dense (the listing's block, post-norm, cross-attention) and as
            # blocks (rotary, grouped heads, SwiGLU), against the same step as numpy's ops
            d, h = 32, 4
            w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype)

            def blocks(n, k):  # Q8_0 blocks, scale 2^-14 (float16 0x0400)
                q = rng.integers(0, 256, (n, k // 32, 34), np.uint8)
                q[:, :, :2] = [0, 4]
                return QuantizedMatrix("Q8_0", q.reshape(n, -1))
            one = np.ones(d, dtype)
            cross = dict(norm=(one, one), q=w(d, d), o=w(d, d), memory=(w(5, d), w(5, d)),
                         keep=[1, 0, 1, 1, 1])
            dense = dict(heads=h, norm1=(one, one * 0), qkv=w(d, 3 * d), o=w(d, d), norm2=(one, one),
                         up=(w(d, 48), one[:1].repeat(48)), down=(w(48, d), one), eps=1e-5, post_norm=True,
                         cross=cross)
            quantized = dict(heads=h, kv_heads=2, norm1=one, qkv=blocks(64, d), o=blocks(d, d), norm2=one,
                             up=blocks(128, d), down=blocks(d, 64), eps=1e-5, activation="swiglu",
                             rope_base=1e4)
            for kw, shape in ((dense, (6, d)), (quantized, (2, 6, 8))):
                steps = []
                for be in ("numba", "numpy"):
                    K, V = np.zeros(shape, dtype), np.zeros(shape, dtype)
                    step = silkattn.ops.layer_step_record(cache=(K, V), **kw)
                    x = np.ones(d, dtype)
                    with silkattn.use_backend(be):
                        for pos in range(4):
                            silkattn.ops.layer_step(step, x, pos)
                    steps.append((x, K))
                np.testing.assert_allclose(steps[0][0], steps[1][0], rtol=1e-4, atol=1e-4)
                np.testing.assert_allclose(steps[0][1], steps[1][1], rtol=1e-4, atol=1e-4)
    print("nojit ok")
""")


def test_numba_kernels_run_as_python():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "nojit ok" in proc.stdout
