"""The tolerance table shared by the tests and the benchmarks' correctness checks."""
import numpy as np

# How far a kernel's answer may stray from the reference's answer computed in float64 on the
# same inputs, per dtype (so the table bounds the kernel's own error, not the reference's).
TOL = {
    np.dtype(np.float32): dict(rtol=1e-4, atol=1e-5),
    np.dtype(np.float64): dict(rtol=1e-10, atol=1e-11),
}


# Whole models' logits (several units in the tests' files) after a few layers of float32 products,
# each product's sum rounded in the kernel's own order: errors of a few 1e-6 of the largest logit,
# above TOL's absolute 1e-5 where logits reach 3 or more.
TOL_MODEL = {
    np.dtype(np.float32): dict(rtol=1e-4, atol=3e-5),
    np.dtype(np.float64): TOL[np.dtype(np.float64)],
}


# A model whose products round their rows to 8 bits (QuantizedMatrix.activations "int8") against
# reference.llama doing the same in float32: the same arithmetic, except that an activation within
# a rounding of the midpoint between two of its block's 255 steps may round to either step (the
# kernels sum in their own order), moving one product's term by d = max |x| / 127 (the max over a
# block of 32, or of 256 for the K-quants: a larger step): in the tests' small models, logits by
# up to several hundredths. The integer products themselves are held to float32's bound, their q
# exact (tests/test_linear_q.py); this table is for whole models.
TOL_Q8 = {
    np.dtype(np.float32): dict(rtol=2e-2, atol=1e-1),
}


# A step over a float16 KV cache against one that sums its products in another order (a batch's
# rows against a row alone, the float32 cache's step): a key or value that differs in float32's
# last bit can round to the neighbouring float16 (2^-11 of it apart), and that rounding, not the
# last bit, is what the attention then reads: the tests' rows of order 1 move by up to a few 1e-4.
TOL_F16_CACHE = {
    np.dtype(np.float32): dict(rtol=2e-3, atol=2e-3),
}


# Gradients (the backward ops): each is a sum over a whole axis of the forward (dK and dV over every
# query of a key, dQ over every key of a query, a norm's dg over every row), rounded in the
# kernel's order, so their float32 error grows with those lengths: a few 1e-6 absolute over the
# tests' hundreds of terms of order 1, above TOL's 1e-5 when the sums reach tens. The attention's
# weights are also recomputed from the forward's float32 lse: scores in the tens or hundreds (ALiBi
# past a q_offset of 150, softcap 30) carry their last bit (1e-6 to 1.5e-5) into every weight, and
# a dV or dK of 140 queries that cancels to near zero kept up to 7.3e-5 of that (the worst of 1400
# random geometries of tests/test_attention_backward.py's; a CI run drew one at 6.1e-5): 2e-4.
TOL_GRAD = {
    np.dtype(np.float32): dict(rtol=2e-4, atol=2e-4),
    np.dtype(np.float64): dict(rtol=1e-9, atol=1e-10),
}


def assert_close(actual, expected, dtype=None, table=TOL):
    """actual has the reference's shape, the given dtype, and values within that dtype's tolerance."""
    dtype = np.dtype(dtype or expected.dtype)
    assert isinstance(actual, np.ndarray)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    np.testing.assert_allclose(actual, expected, **table[dtype])


def assert_matches(result, expected, dtype, table=TOL):
    """result against the reference's answer (computed in float64): token ids equal; arrays of the
    reference's shape, the given dtype and values within that dtype's tolerance (in table)."""
    expected = np.asarray(expected)
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(result, expected)
    else:
        assert_close(result, expected.astype(dtype), dtype, table)


# models.llama.load's options for the float32 path the tolerance tables above bound against the
# reference (load's defaults are llama.cpp's: int8 activations, a float16 cache; TOL_Q8 and
# TOL_F16_CACHE bound those)
EXACT = dict(activations="float32", kv_dtype="float32")
