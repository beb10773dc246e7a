"""silkattn: fast, tested CPU transformer kernels behind the NumPy reference's API.

Layout (data flows one way: models -> ops -> _api -> kernels):
  reference        the NumPy oracle: the seed listing's functions, which define the semantics
  quant            QuantizedMatrix: a matrix kept as its GGUF weight blocks, for ops.linear
  ops              the kernels API (softmax, layer_norm, attention, fused ops) on the current backend
  models           whole models composed from ops: the listing's decoder, the paper's encoder-decoder,
                   generation with a KV cache
  cython, numba    the compiled backends, each a Kernels record (silkattn._backends)

The top-level functions are the listing's names on the current backend; choose one with
set_backend(name), `with use_backend(name):` or SILKATTN_BACKEND.
"""
from . import _openblas, models, ops, reference  # noqa: F401  (_openblas: numpy's idle BLAS threads sleep)
from ._backends import backends, get_backend, set_backend, use_backend
from ._cache import clear as clear_cache
from ._patch import patch, patched, unpatch
from ._threads import get_num_threads, set_num_threads
from .models import (
                     DecoderConfig,
                     Seq2SeqConfig,
                     block,
                     decode,
                     decoder_block,
                     encode,
                     encoder_block,
                     feed_forward,
                     generate,
                     init_seq2seq_params,
                     multi_head,
                     transformer,
)
from .ops import (
                     add_layer_norm,
                     add_rms_norm,
                     attention,
                     attention_backward,
                     attention_paged,
                     attention_varlen,
                     bias_gelu,
                     bias_relu,
                     cross_entropy,
                     cross_entropy_and_grads,
                     cross_entropy_backward,
                     embedding_backward,
                     feed_forward_backward,
                     gate_mul,
                     gelu_tanh_mul,
                     layer_norm,
                     layer_norm_backward,
                     linear,
                     linear_backward,
                     matmul_int8,
                     rms_norm,
                     rms_norm_backward,
                     rope,
                     silu_mul,
                     softmax,
                     softmax_backward,
)
from .quant import QuantizedMatrix
from .reference import causal_mask, init_params, positional_encoding

__version__ = "0.1.0"
__all__ = ["reference", "ops", "models", "backends", "get_backend", "set_backend", "use_backend", "patch",
           "attention_backward", "softmax_backward", "layer_norm_backward", "rms_norm_backward",
           "linear_backward", "feed_forward_backward", "embedding_backward", "cross_entropy",
           "cross_entropy_and_grads", "cross_entropy_backward", "attention_varlen", "attention_paged",
           "bias_gelu", "rms_norm", "add_rms_norm", "rope", "silu_mul",
           "gelu_tanh_mul", "gate_mul", "matmul_int8",
           "patched", "unpatch", "get_num_threads", "set_num_threads", "softmax", "attention", "layer_norm",
           "linear", "bias_relu", "add_layer_norm", "multi_head", "feed_forward", "block", "transformer",
           "DecoderConfig", "positional_encoding", "causal_mask", "init_params", "Seq2SeqConfig",
           "encoder_block", "decoder_block", "encode", "decode", "generate", "init_seq2seq_params",
           "QuantizedMatrix", "clear_cache"]
