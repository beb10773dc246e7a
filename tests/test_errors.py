"""Bad input: one table of cases, run on every backend; each must raise the same error class with a
message that names the argument. Inputs are never modified, and odd-but-valid inputs just work."""
import numpy as np
import pytest

from silkattn import reference as ref
from silkattn.quant import QuantizedMatrix

from conftest import assert_close


def f32(*shape):
    return np.ones(shape, np.float32)


Q = f32(4, 8)
Q3, Q6, K4, K9 = f32(2, 4, 8), f32(6, 4, 8), f32(4, 4, 8), f32(2, 9, 8)
QW = QuantizedMatrix("Q4_1", np.zeros((3, 2 * 20), np.uint8))  # W: (64, 3) as GGUF blocks
QBUF = f32(200)  # X and an out inside it

# (id, op, args, kwargs, error class, text the message must contain)
BAD = [
    ("Q_1d", "attention", (f32(8), Q, Q), {}, ValueError, "Q must have at least 2"),
    ("K_1d", "attention", (Q, f32(8), Q), {}, ValueError, "K must have at least 2"),
    ("dk_differs", "attention", (Q, f32(4, 7), f32(4, 8)), {}, ValueError, "d_k"),
    ("kv_lengths_differ", "attention", (Q, f32(5, 8), f32(4, 8)), {}, ValueError, "same number of keys"),
    ("mask_shape", "attention", (Q, Q, Q, np.ones((3, 4), bool)), {}, ValueError, "mask of shape (3, 4)"),
    ("mask_batch", "attention", (f32(2, 4, 8), f32(2, 4, 8), f32(2, 4, 8), np.ones((3, 4, 4), bool)), {},
     ValueError, "mask"),
    ("lead_dims", "attention", (f32(2, 4, 8), f32(3, 4, 8), f32(3, 4, 8)), {},
     ValueError, "leading (batch) dims"),
    ("Q_int", "attention", (np.ones((4, 8), int), Q, Q), {}, TypeError, "Q must be a float32 or float64"),
    ("K_complex", "attention", (Q, np.ones((4, 8), complex), Q), {}, TypeError, "K must be"),
    ("V_object", "attention", (Q, Q, np.ones((4, 8), object)), {}, TypeError, "V must be"),
    ("V_str", "attention", (Q, Q, np.full((4, 8), "a")), {}, TypeError, "V must be"),
    ("Q_bool", "attention", (np.ones((4, 8), bool), Q, Q), {}, TypeError, "Q must be"),
    ("mask_str", "attention", (Q, Q, Q, np.full((4, 4), "yes")), {}, TypeError, "mask must be boolean"),
    ("no_keys", "attention", (Q, f32(0, 8), f32(0, 8)), {}, ValueError, "Sk = 0"),
    ("dk_zero", "attention", (f32(4, 0), f32(4, 0), Q), {}, ValueError, "d_k = 0"),
    ("out_shape", "attention", (Q, Q, Q), {"out": f32(4, 7)}, ValueError, "out must have shape (4, 8)"),
    ("out_dtype", "attention", (Q, Q, Q), {"out": np.ones((4, 8))}, ValueError, "dtype float32"),
    ("out_list", "attention", (Q, Q, Q), {"out": [[0.0] * 8] * 4}, TypeError, "out must be a numpy.ndarray"),
    ("out_strided", "attention", (Q, Q, Q), {"out": f32(4, 16)[:, ::2]}, ValueError, "C-contiguous"),
    ("out_readonly", "attention", (Q, Q, Q), {"out": np.broadcast_to(np.float32(0), (4, 8))},
     ValueError, "writeable"),
    ("softmax_0d", "softmax", (np.float32(1.0),), {}, ValueError, "x must have at least one dimension"),
    ("softmax_empty_axis", "softmax", (f32(3, 0),), {}, ValueError, "zero-length last axis"),
    ("softmax_int", "softmax", (np.arange(4),), {}, TypeError, "x must be a float32 or float64"),
    ("softmax_out_shape", "softmax", (f32(3, 4),), {"out": f32(4, 3)}, ValueError, "out must have shape"),
    ("ln_g_length", "layer_norm", (f32(3, 4), f32(5), f32(4)), {}, ValueError, "g must have shape (4,)"),
    ("ln_b_length", "layer_norm", (f32(3, 4), f32(4), f32(3)), {}, ValueError, "b must have shape (4,)"),
    ("ln_g_per_row", "layer_norm", (f32(3, 4), f32(3, 4), f32(4)), {}, ValueError, "g must have shape"),
    ("ln_eps_negative", "layer_norm", (f32(3, 4), f32(4), f32(4)), {"eps": -1e-5},
     ValueError, "eps must be >= 0"),
    ("ln_eps_nan", "layer_norm", (f32(3, 4), f32(4), f32(4)), {"eps": float("nan")}, ValueError, "eps"),
    ("ln_X_int", "layer_norm", (np.ones((3, 4), int), f32(4), f32(4)), {}, TypeError, "X must be"),
    ("ln_g_str", "layer_norm", (f32(3, 4), np.array(["a"] * 4), f32(4)), {}, TypeError, "g must be"),
    ("ln_0d", "layer_norm", (np.float32(2), f32(1), f32(1)), {}, ValueError, "X must have at least one"),
    ("ln_empty_axis", "layer_norm", (f32(3, 0), f32(0), f32(0)), {}, ValueError, "zero-length last axis"),
    ("offset_negative", "attention", (Q, Q, Q), {"causal": True, "q_offset": -1},
     ValueError, "q_offset must be >= 0"),
    ("offset_float", "attention", (Q, Q, Q), {"causal": True, "q_offset": 1.5},
     TypeError, "q_offset must be an int"),
    ("offset_not_causal", "attention", (Q, Q, Q), {"q_offset": 2}, ValueError, "pass causal=True"),
    # attention's keywords (scale, softcap, bias, alibi_slopes, window, q_offset), grouped-query heads
    # and attention_varlen's cu_seqlens_k: Q3 has 2 query heads, Q6 6 (K4: 4 K/V heads), 4 rows of d_k = 8
    ("gqa_not_multiple", "attention", (Q6, K4, K4), {}, ValueError, "multiple"),
    ("gqa_one_query_head", "attention", (f32(1, 4, 8), f32(3, 4, 8), f32(3, 4, 8)), {},
     ValueError, "multiple"),
    ("gqa_kv_heads_differ", "attention", (Q6, f32(2, 4, 8), f32(3, 4, 8)), {}, ValueError, "as many heads"),
    ("gqa_mask_per_kv_head", "attention", (f32(4, 4, 8), Q3, Q3, np.ones((2, 4, 4), bool)), {},
     ValueError, "mask of shape (2, 4, 4)"),
    ("gqa_bias_per_kv_head", "attention", (f32(4, 4, 8), Q3, Q3), {"bias": f32(2, 4, 4)},
     ValueError, "bias of shape (2, 4, 4)"),
    ("bias_shape", "attention", (Q, Q, Q), {"bias": f32(3, 4)}, ValueError, "bias of shape (3, 4)"),
    ("bias_heads", "attention", (Q3, Q3, Q3), {"bias": f32(3, 4, 4)}, ValueError, "bias of shape (3, 4, 4)"),
    ("bias_keys", "attention", (Q, Q, Q), {"bias": f32(5)}, ValueError, "bias of shape"),
    ("bias_str", "attention", (Q, Q, Q), {"bias": np.full((4, 4), "a")}, TypeError, "bias must be"),
    ("bias_bool", "attention", (Q, Q, Q), {"bias": np.ones((4, 4), bool)}, TypeError, "bias must be"),
    ("scale_zero", "attention", (Q, Q, Q), {"scale": 0}, ValueError, "scale must be"),
    ("scale_negative", "attention", (Q, Q, Q), {"scale": -0.5}, ValueError, "scale must be"),
    ("scale_nan", "attention", (Q, Q, Q), {"scale": float("nan")}, ValueError, "scale must be"),
    ("scale_inf", "attention", (Q, Q, Q), {"scale": float("inf")}, ValueError, "scale must be"),
    ("scale_str", "attention", (Q, Q, Q), {"scale": "0.5"}, TypeError, "scale must be"),
    ("scale_bool", "attention", (Q, Q, Q), {"scale": True}, TypeError, "scale must be"),
    ("softcap_zero", "attention", (Q, Q, Q), {"softcap": 0.0}, ValueError, "softcap must be"),
    ("softcap_negative", "attention", (Q, Q, Q), {"softcap": -30}, ValueError, "softcap must be"),
    ("softcap_inf", "attention", (Q, Q, Q), {"softcap": float("inf")}, ValueError, "softcap must be"),
    ("softcap_nan", "attention", (Q, Q, Q), {"softcap": float("nan")}, ValueError, "softcap must be"),
    ("softcap_complex", "attention", (Q, Q, Q), {"softcap": 1j}, TypeError, "softcap must be"),
    ("window_one_side", "attention", (Q, Q, Q), {"window": (3,)}, TypeError, "window must be"),
    ("window_three", "attention", (Q, Q, Q), {"window": (1, 2, 3)}, TypeError, "window must be"),
    ("window_int", "attention", (Q, Q, Q), {"window": 5}, TypeError, "window must be"),
    ("window_str", "attention", (Q, Q, Q), {"window": "ab"}, TypeError, "window must be"),
    ("window_below_minus_1", "attention", (Q, Q, Q), {"window": (-2, 0)}, ValueError, "window must be"),
    ("window_right_below", "attention", (Q, Q, Q), {"window": (0, -5)}, ValueError, "window must be"),
    ("window_float", "attention", (Q, Q, Q), {"window": (1.5, 0)}, TypeError, "window must be"),
    ("window_bool", "attention", (Q, Q, Q), {"window": (True, 0)}, TypeError, "window must be"),
    ("alibi_length", "attention", (Q3, Q3, Q3), {"alibi_slopes": [0.5, 0.25, 0.125]},
     ValueError, "alibi_slopes"),
    ("alibi_2d", "attention", (Q3, Q3, Q3), {"alibi_slopes": [[0.5, 0.25]]}, ValueError, "alibi_slopes"),
    ("alibi_gqa_kv_heads", "attention", (f32(4, 4, 8), Q3, Q3), {"alibi_slopes": [0.5, 0.25]},
     ValueError, "alibi_slopes"),
    ("alibi_no_head_axis", "attention", (Q, Q, Q), {"alibi_slopes": [0.5]}, ValueError, "alibi_slopes"),
    ("alibi_nan", "attention", (Q3, Q3, Q3), {"alibi_slopes": [0.5, float("nan")]},
     ValueError, "alibi_slopes"),
    ("alibi_str", "attention", (Q3, Q3, Q3), {"alibi_slopes": ["a", "b"]}, TypeError, "alibi_slopes"),
    ("offset_with_scale_only", "attention", (Q, Q, Q), {"q_offset": 2, "scale": 0.5}, ValueError, "q_offset"),
    ("offset_with_bias_only", "attention", (Q, Q, Q), {"q_offset": 2, "bias": f32(4, 4)},
     ValueError, "q_offset"),
    ("offset_with_mask_only", "attention", (Q, Q, Q, np.ones((4, 4), bool)), {"q_offset": 1},
     ValueError, "q_offset"),
    ("offset_negative_window", "attention", (Q, Q, Q), {"window": (2, 0), "q_offset": -3},
     ValueError, "q_offset must be >= 0"),
    ("varlen_k_count", "attention_varlen", (Q3, K9, K9, [0, 1, 4]), {"cu_seqlens_k": [0, 9]},
     ValueError, "cu_seqlens_k"),
    ("varlen_k_end", "attention_varlen", (Q3, K9, K9, [0, 1, 4]), {"cu_seqlens_k": [0, 4, 8]},
     ValueError, "cu_seqlens_k"),
    ("varlen_k_decreasing", "attention_varlen", (Q3, K9, K9, [0, 1, 4]), {"cu_seqlens_k": [0, 5, 4, 9][:3]},
     ValueError, "cu_seqlens_k"),
    ("varlen_k_float", "attention_varlen", (Q3, K9, K9, [0, 1, 4]), {"cu_seqlens_k": [0.0, 4.0, 9.0]},
     TypeError, "cu_seqlens_k"),
    ("varlen_k_no_keys", "attention_varlen", (Q3, K9, K9, [0, 1, 4]), {"cu_seqlens_k": [0, 9, 9]},
     ValueError, "cu_seqlens_k"),
    ("varlen_gqa_not_multiple", "attention_varlen", (Q6, K4, K4, [0, 1, 4]), {}, ValueError, "multiple"),
    ("varlen_bias_shape", "attention_varlen", (Q3, K9, K9, [0, 1, 4]),
     {"cu_seqlens_k": [0, 4, 9], "bias": f32(3, 4, 9)}, ValueError, "bias of shape (3, 4, 9)"),
    ("varlen_scale", "attention_varlen", (Q3, Q3, Q3, [0, 4]), {"scale": -1.0}, ValueError, "scale must be"),
    ("varlen_softcap", "attention_varlen", (Q3, Q3, Q3, [0, 4]), {"softcap": 0},
     ValueError, "softcap must be"),
    ("varlen_window", "attention_varlen", (Q3, Q3, Q3, [0, 4]), {"window": (0, -3)},
     ValueError, "window must be"),
    ("varlen_alibi_length", "attention_varlen", (Q3, Q3, Q3, [0, 4]), {"alibi_slopes": [1.0]},
     ValueError, "alibi_slopes"),
    ("varlen_alibi_no_heads", "attention_varlen", (Q, Q, Q, [0, 4]), {"alibi_slopes": [1.0]},
     ValueError, "alibi_slopes"),
    ("relu_b_length", "bias_relu", (f32(3, 4), f32(5)), {}, ValueError, "b must have shape (4,)"),
    ("relu_x_int", "bias_relu", (np.ones((3, 4), int), f32(4)), {}, TypeError, "x must be"),
    ("relu_out_overlap", "bias_relu", (f32(2, 4)[:, :2], f32(2)), {"out": f32(2, 4)[:, :2]},
     ValueError, "C-contiguous"),
    ("add_ln_shapes", "add_layer_norm", (f32(3, 4), f32(1, 4), f32(4), f32(4)), {},
     ValueError, "R must have the shape of X"),
    ("add_ln_g", "add_layer_norm", (f32(3, 4), f32(3, 4), f32(3), f32(4)), {},
     ValueError, "g must have shape (4,)"),
    # the Llama family's ops: rms_norm, add_rms_norm, rope, silu_mul
    ("rms_g_length", "rms_norm", (f32(3, 4), f32(5)), {}, ValueError, "g must have shape (4,)"),
    ("rms_g_per_row", "rms_norm", (f32(3, 4), f32(3, 4)), {}, ValueError, "g must have shape (4,)"),
    ("rms_eps_zero", "rms_norm", (f32(3, 4), f32(4)), {"eps": 0.0},
     ValueError, "eps must be a positive finite"),
    ("rms_eps_negative", "rms_norm", (f32(3, 4), f32(4)), {"eps": -1e-6},
     ValueError, "eps must be a positive"),
    ("rms_eps_nan", "rms_norm", (f32(3, 4), f32(4)), {"eps": float("nan")}, ValueError, "eps must be"),
    ("rms_eps_inf", "rms_norm", (f32(3, 4), f32(4)), {"eps": float("inf")}, ValueError, "eps must be"),
    ("rms_eps_str", "rms_norm", (f32(3, 4), f32(4)), {"eps": "1e-5"}, TypeError, "eps must be"),
    ("rms_eps_none", "rms_norm", (f32(3, 4), f32(4)), {"eps": None}, TypeError, "eps must be"),
    ("rms_X_int", "rms_norm", (np.ones((3, 4), int), f32(4)), {},
     TypeError, "X must be a float32 or float64"),
    ("rms_g_str", "rms_norm", (f32(3, 4), np.array(["a"] * 4)), {}, TypeError, "g must be"),
    ("rms_0d", "rms_norm", (np.float32(2), f32(1)), {}, ValueError, "X must have at least one"),
    ("rms_empty_axis", "rms_norm", (f32(3, 0), f32(0)), {}, ValueError, "zero-length last axis"),
    ("rms_out_shape", "rms_norm", (f32(3, 4), f32(4)), {"out": f32(4, 3)},
     ValueError, "out must have shape (3, 4)"),
    ("rms_out_dtype", "rms_norm", (f32(3, 4), f32(4)), {"out": np.ones((3, 4))}, ValueError, "dtype float32"),
    ("rms_out_strided", "rms_norm", (f32(3, 4), f32(4)), {"out": f32(3, 8)[:, ::2]},
     ValueError, "C-contiguous"),
    ("add_rms_shapes", "add_rms_norm", (f32(3, 4), f32(1, 4), f32(4)), {},
     ValueError, "R must have the shape of X"),
    ("add_rms_g", "add_rms_norm", (f32(3, 4), f32(3, 4), f32(3)), {}, ValueError, "g must have shape (4,)"),
    ("add_rms_eps", "add_rms_norm", (f32(3, 4), f32(3, 4), f32(4)), {"eps": 0}, ValueError, "eps must be"),
    ("add_rms_R_int", "add_rms_norm", (f32(3, 4), np.ones((3, 4), int), f32(4)), {}, TypeError, "R must be"),
    ("rope_1d", "rope", (f32(8), [0]), {}, ValueError, "X must have at least 2 dimensions"),
    ("rope_odd_d_head", "rope", (f32(4, 7), np.arange(4)), {}, ValueError, "d_head must be even"),
    ("rope_X_int", "rope", (np.ones((4, 8), int), np.arange(4)), {},
     TypeError, "X must be a float32 or float64"),
    ("rope_positions_length", "rope", (f32(4, 8), np.arange(3)), {},
     ValueError, "positions must have shape (4,)"),
    ("rope_positions_2d", "rope", (f32(4, 8), np.zeros((1, 4), int)), {}, ValueError,
     "positions must have shape (4,)"),
    ("rope_positions_scalar", "rope", (f32(1, 8), 0), {}, ValueError, "positions must have shape (1,)"),
    ("rope_positions_negative", "rope", (f32(4, 8), [0, 1, -2, 3]), {}, ValueError, "positions must be >= 0"),
    ("rope_positions_float", "rope", (f32(4, 8), [0.0, 1.0, 2.0, 3.0]), {},
     TypeError, "positions must be integers"),
    ("rope_positions_bool", "rope", (f32(4, 8), np.ones(4, bool)), {},
     TypeError, "positions must be integers"),
    ("rope_positions_str", "rope", (f32(4, 8), ["0", "1", "2", "3"]), {},
     TypeError, "positions must be integers"),
    ("rope_base_zero", "rope", (f32(4, 8), np.arange(4), 0.0), {},
     ValueError, "base must be a positive finite"),
    ("rope_base_negative", "rope", (f32(4, 8), np.arange(4)), {"base": -1e4}, ValueError, "base must be"),
    ("rope_base_nan", "rope", (f32(4, 8), np.arange(4)), {"base": float("nan")}, ValueError, "base must be"),
    ("rope_base_inf", "rope", (f32(4, 8), np.arange(4)), {"base": float("inf")}, ValueError, "base must be"),
    ("rope_base_str", "rope", (f32(4, 8), np.arange(4)), {"base": "10000"}, TypeError, "base must be"),
    ("rope_base_bool", "rope", (f32(4, 8), np.arange(4)), {"base": True}, TypeError, "base must be"),
    ("rope_out_shape", "rope", (f32(4, 8), np.arange(4)), {"out": f32(4, 6)},
     ValueError, "out must have shape (4, 8)"),
    ("rope_out_dtype", "rope", (f32(4, 8), np.arange(4)), {"out": np.ones((4, 8))},
     ValueError, "dtype float32"),
    ("rope_out_strided", "rope", (f32(4, 8), np.arange(4)), {"out": f32(4, 16)[:, ::2]},
     ValueError, "C-contiguous"),
    ("rope_out_list", "rope", (f32(4, 8), np.arange(4)), {"out": [[0.0] * 8] * 4},
     TypeError, "out must be a numpy"),
    ("silu_shapes", "silu_mul", (f32(3, 4), f32(3, 5)), {}, ValueError, "U must have the shape of G (3, 4)"),
    ("silu_broadcast", "silu_mul", (f32(3, 4), f32(4)), {}, ValueError, "U must have the shape of G (3, 4)"),
    ("silu_G_int", "silu_mul", (np.ones((3, 4), int), f32(3, 4)), {},
     TypeError, "G must be a float32 or float64"),
    ("silu_U_str", "silu_mul", (f32(3, 4), np.full((3, 4), "a")), {}, TypeError, "U must be"),
    ("silu_out_shape", "silu_mul", (f32(3, 4), f32(3, 4)), {"out": f32(4, 3)},
     ValueError, "out must have shape (3, 4)"),
    ("silu_out_dtype", "silu_mul", (f32(3, 4), f32(3, 4)), {"out": np.ones((3, 4))},
     ValueError, "dtype float32"),
    # linear with W as GGUF blocks (QW: a (64, 3) QuantizedMatrix)
    ("q_X_width", "linear", (f32(2, 32), QW), {}, ValueError, "W must have shape (32, n)"),
    ("q_X_0d", "linear", (np.float32(1), QW), {}, ValueError, "X must have at least one dimension"),
    ("q_X_int", "linear", (np.ones((2, 64), int), QW), {}, TypeError, "X must be a float32 or float64"),
    ("q_b_length", "linear", (f32(2, 64), QW, f32(4)), {}, ValueError, "b must have shape (3,)"),
    ("q_b_str", "linear", (f32(2, 64), QW, np.array(["a"] * 3)), {}, TypeError, "b must be"),
    ("q_out_shape", "linear", (f32(2, 64), QW), {"out": f32(2, 4)}, ValueError, "out must have shape (2, 3)"),
    ("q_out_dtype", "linear", (f32(2, 64), QW), {"out": np.ones((2, 3))}, ValueError, "dtype float32"),
    ("q_out_dtype_b64", "linear", (f32(2, 64), QW, np.ones(3)), {"out": f32(2, 3)},
     ValueError, "dtype float64"),
    ("q_out_strided", "linear", (f32(2, 64), QW), {"out": f32(2, 6)[:, ::2]}, ValueError, "C-contiguous"),
    ("q_out_overlap", "linear", (QBUF[:128].reshape(2, 64), QW), {"out": QBUF[100:106].reshape(2, 3)},
     ValueError, "overlap"),
    ("silu_out_readonly", "silu_mul", (f32(3, 4), f32(3, 4)), {"out": np.broadcast_to(np.float32(0), (3, 4))},
     ValueError, "writeable"),
]


# QuantizedMatrix(kind, blocks): (id, kind, blocks, error class, text the message must contain)
QUANT_BAD = [
    ("kind_unknown", "Q2_K", np.zeros((2, 40), np.uint8), ValueError, "must be one of Q8_0, Q4_0, Q4_1, Q5"),
    ("kind_lowercase", "q4_1", np.zeros((2, 40), np.uint8), ValueError, "kind must be one of"),
    ("kind_int", 2, np.zeros((2, 40), np.uint8), TypeError, "kind must be a str"),
    ("blocks_list", "Q4_1", [[0] * 40] * 2, TypeError, "blocks must be a numpy.ndarray"),
    ("blocks_int8", "Q8_0", np.zeros((2, 34), np.int8), TypeError, "blocks must be uint8"),
    ("blocks_float", "Q4_0", np.zeros((2, 18), np.float32), TypeError, "blocks must be uint8"),
    ("blocks_1d", "Q4_1", np.zeros(40, np.uint8), ValueError, "blocks must be 2-D"),
    ("blocks_3d", "Q4_1", np.zeros((2, 2, 20), np.uint8), ValueError, "blocks must be 2-D"),
    ("blocks_part_block", "Q4_1", np.zeros((2, 41), np.uint8), ValueError, "whole Q4_1 blocks of 20 bytes"),
    ("blocks_q8_row", "Q8_0", np.zeros((2, 40), np.uint8), ValueError, "whole Q8_0 blocks of 34 bytes"),
    ("blocks_strided", "Q4_1", np.zeros((2, 80), np.uint8)[:, ::2], ValueError, "C-contiguous"),
    ("activations_q8", "Q4_1", np.zeros((2, 40), np.uint8), ValueError,
     "activations must be one of float32, int8", "q8"),
    ("activations_bool", "Q4_1", np.zeros((2, 40), np.uint8), TypeError, "activations must be a str", True),
]


@pytest.mark.parametrize("kind, blocks, error, text, activations",
                         [c[1:] + (("float32",) if len(c) == 5 else ()) for c in QUANT_BAD],
                         ids=[c[0] for c in QUANT_BAD])
def test_bad_quantized_matrix_is_a_clear_error(kind, blocks, error, text, activations):
    with pytest.raises(error) as info:
        QuantizedMatrix.from_blocks(kind, blocks, activations)
    assert text in str(info.value)


@pytest.mark.parametrize("op, args, kwargs, error, text", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_a_clear_error(any_backend, op, args, kwargs, error, text):
    with pytest.raises(error) as info:
        getattr(any_backend, op)(*args, **kwargs)
    assert text in str(info.value)


def test_out_overlapping_an_input_is_refused(any_backend):
    buf = np.ones((8, 8), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        any_backend.attention(buf[:4], buf[:4], buf[:4], out=buf[:4])
    with pytest.raises(ValueError, match="overlap"):
        any_backend.softmax(buf, out=buf)


def test_odd_but_valid_inputs(any_backend, rng):
    Qd, Kd, Vd = (rng.standard_normal((6, 5)) for _ in range(3))
    expected = ref.attention(Qd, Kd, Vd)
    # lists, mixed float32/float64 (promoted like NumPy: float64), read-only and reversed views
    assert_close(any_backend.attention(Qd.tolist(), Kd, Vd), expected, np.float64)
    Q32 = Qd.astype(np.float32)
    assert_close(any_backend.attention(Q32, Kd, Vd), ref.attention(Q32.astype(np.float64), Kd, Vd),
                 np.float64)
    ro = Qd.copy()
    ro.flags.writeable = False
    assert_close(any_backend.attention(ro, Kd, Vd), expected, np.float64)
    assert_close(any_backend.attention(Qd[::-1], Kd[::-1], Vd[::-1]),
                 ref.attention(Qd[::-1], Kd[::-1], Vd[::-1]))
    # 0/1 integer and float masks read as np.where reads them
    mask = rng.random((6, 6)) < 0.5
    for as_numbers in (mask.astype(np.uint8), mask.astype(np.int64) * 7, mask.astype(np.float32)):
        assert_close(any_backend.attention(Qd, Kd, Vd, as_numbers), ref.attention(Qd, Kd, Vd, mask))
    # empty query axis and empty batch: empty results of the right shape
    assert any_backend.attention(np.ones((0, 5)), Kd, Vd).shape == (0, 5)
    empty_batch = any_backend.attention(np.ones((2, 0, 5)), np.ones((2, 3, 5)), np.ones((2, 3, 4)))
    assert empty_batch.shape == (2, 0, 4)
    assert any_backend.softmax(np.ones((0, 3))).shape == (0, 3)
    assert_close(any_backend.softmax([1.0, 2.0, 3.0]), ref.softmax(np.array([1.0, 2.0, 3.0])))
    assert_close(any_backend.layer_norm([[1.0, 2.0, 4.0]], 1.0, 0.0),
                 ref.layer_norm(np.array([[1.0, 2.0, 4.0]]), 1.0, 0.0))


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_nan_and_inf_propagate_like_the_reference(any_backend):
    Qn = np.zeros((3, 4))
    Qn[1, 2] = np.nan
    K = np.ones((5, 4))
    V = np.arange(20.0).reshape(5, 4)
    np.testing.assert_array_equal(np.isnan(any_backend.attention(Qn, K, V)),
                                  np.isnan(ref.attention(Qn, K, V)))
    mask = np.ones((3, 5), bool)
    Kn = K.copy()
    Kn[4] = np.nan
    mask[:, 4] = False  # a NaN key that is masked out does not reach the output
    np.testing.assert_array_equal(any_backend.attention(Qn[[0, 2]], Kn, V, mask[[0, 2]]),
                                  ref.attention(Qn[[0, 2]], Kn, V, mask[[0, 2]]))
    x = np.array([[1.0, np.inf, 0.0], [1.0, np.nan, 2.0], [-np.inf, 0.0, 1.0]])
    np.testing.assert_array_equal(np.isnan(any_backend.softmax(x)), np.isnan(ref.softmax(x)))
    assert_close(any_backend.softmax(x[2:]), ref.softmax(x[2:]))
    X = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, np.inf]])
    np.testing.assert_array_equal(np.isnan(any_backend.layer_norm(X, np.ones(3), np.zeros(3))),
                                  np.isnan(ref.layer_norm(X, np.ones(3), np.zeros(3))))


def test_inputs_are_never_modified(any_backend, rng):
    Qa, Ka, Va = (rng.standard_normal((2, 30, 16)).astype(np.float32) for _ in range(3))
    mask = rng.random((30, 30)) < 0.5
    g, b = rng.standard_normal(16), rng.standard_normal(16)
    copies = [a.copy() for a in (Qa, Ka, Va, mask, g, b)]
    any_backend.attention(Qa, Ka, Va, mask, causal=True)
    any_backend.softmax(Qa)
    any_backend.layer_norm(Qa, g, b)
    any_backend.rms_norm(Qa, g)
    any_backend.add_rms_norm(Qa, Ka, g)
    any_backend.rope(Qa, np.arange(30))
    any_backend.silu_mul(Qa, Ka)
    for before, after in zip(copies, (Qa, Ka, Va, mask, g, b)):
        np.testing.assert_array_equal(before, after)


def test_in_place_is_allowed_and_partial_overlap_is_not(any_backend):
    """rope's out may be X, silu_mul's G or U, in any layout; any other overlap is refused."""
    H = np.ones((4, 16), np.float32)
    G, U = H[:, :8], H[:, 8:]
    with pytest.raises(ValueError, match="overlap"):
        any_backend.silu_mul(G, U, out=H.reshape(-1)[4:36].reshape(4, 8))  # straddles both halves
    with pytest.raises(ValueError, match="dtype float64"):
        any_backend.silu_mul(G, U.astype(np.float64), out=G)  # the result is float64: not G
    frozen = H.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        any_backend.silu_mul(frozen[:, :8], frozen[:, 8:], out=frozen[:, :8])
    buf = np.ones((2, 8, 8), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        any_backend.rope(buf[0], np.arange(8), out=buf.reshape(16, 8)[4:12])
    with pytest.raises(ValueError, match="writeable"):
        any_backend.rope(frozen.reshape(4, 2, 8).swapaxes(0, 1), np.arange(4),
                         out=frozen.reshape(4, 2, 8).swapaxes(0, 1))
    X = buf[0].copy()
    with pytest.raises(ValueError, match="overlap"):
        any_backend.rms_norm(X, X[0], out=X)  # not offered in place, as layer_norm
    assert any_backend.silu_mul(G, U, out=U) is U


def test_bias_relu_in_place_is_allowed_and_partial_overlap_is_not(any_backend):
    x = np.arange(-4.0, 4.0, dtype=np.float32).reshape(2, 4)
    assert any_backend.bias_relu(x, np.ones(4, np.float32), out=x) is x
    np.testing.assert_array_equal(x, [[0, 0, 0, 0], [1, 2, 3, 4]])
    buf = np.zeros(12, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        any_backend.bias_relu(buf[:8].reshape(2, 4), np.ones(4, np.float32), out=buf[4:].reshape(2, 4))


# The model-level functions: the same errors from the reference and from every backend.
W8, X8 = f32(8, 8), f32(5, 8)
P_SMALL = ref.init_params(11, d=8, h=2, n_layers=1, d_ff=16, max_len=6, seed=0)
LAYER = P_SMALL["layers"][0]
MODEL_BAD = [
    ("h_zero", "multi_head", (X8, W8, W8, W8, W8, 0), ValueError, "h must be >= 1"),
    ("h_negative", "multi_head", (X8, W8, W8, W8, W8, -2), ValueError, "h must be >= 1"),
    ("h_float", "multi_head", (X8, W8, W8, W8, W8, 2.0), TypeError, "h must be an int"),
    ("h_str", "multi_head", (X8, W8, W8, W8, W8, "2"), TypeError, "h must be an int"),
    ("h_bool", "multi_head", (X8, W8, W8, W8, W8, True), TypeError, "h must be an int"),
    ("h_not_dividing", "multi_head", (X8, W8, W8, W8, W8, 3), ValueError, "h=3 does not divide"),
    ("Wq_shape", "multi_head", (X8, f32(8, 6), W8, W8, W8, 2), ValueError, "Wq must have shape (8, 8)"),
    ("Wo_shape", "multi_head", (X8, W8, W8, W8, f32(6, 8), 2), ValueError, "Wo must have shape (8, 8)"),
    ("mh_X_1d", "multi_head", (f32(8), W8, W8, W8, W8, 2), ValueError, "X must have at least 2"),
    ("W1_rows", "feed_forward", (X8, f32(7, 16), f32(16), f32(16, 8), f32(8)),
     ValueError, "W1 must have shape (8, n)"),
    ("b1_length", "feed_forward", (X8, f32(8, 16), f32(15), f32(16, 8), f32(8)),
     ValueError, "b1 must have shape (16,)"),
    ("W2_shape", "feed_forward", (X8, f32(8, 16), f32(16), f32(16, 7), f32(8)),
     ValueError, "W2 must have shape (16, 8)"),
    ("b2_length", "feed_forward", (X8, f32(8, 16), f32(16), f32(16, 8), f32(2, 8)),
     ValueError, "b2 must have shape (8,)"),
    ("block_no_ffn", "block", (X8, {k: v for k, v in LAYER.items() if k != "ffn"}),
     ValueError, "p lacks 'ffn'"),
    ("block_not_dict", "block", (X8, [1, 2]), TypeError, "p must be a dict"),
    ("ids_float", "transformer", (np.array([1.0, 2.0]), P_SMALL), TypeError, "token_ids must be integers"),
    ("ids_range", "transformer", (np.array([1, 11]), P_SMALL), ValueError, "token_ids must lie in [0, 11)"),
    ("ids_negative", "transformer", (np.array([-1, 2]), P_SMALL),
     ValueError, "token_ids must lie in [0, 11)"),
    ("ids_too_long", "transformer", (np.arange(7), P_SMALL), ValueError, "exceed the 6 positions"),
    ("ids_2d", "transformer", (np.ones((2, 2), int), P_SMALL), ValueError, "token_ids must be 1-D"),
    ("ids_empty", "transformer", (np.array([], int), P_SMALL), ValueError, "token_ids is empty"),
]


@pytest.mark.parametrize("fn, args, error, text", [c[1:] for c in MODEL_BAD], ids=[c[0] for c in MODEL_BAD])
def test_model_functions_refuse_bad_arguments(on_backend, fn, args, error, text):
    import silkattn
    for impl in (getattr(ref, fn), getattr(silkattn, fn)):
        with pytest.raises(error) as info:
            impl(*args)
        assert text in str(info.value), (impl, str(info.value))
