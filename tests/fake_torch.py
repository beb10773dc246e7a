"""A stand-in for the few torch calls the benchmark rivals make, computed by silkattn.reference.

Its tensors are ndarrays with torch's .numpy(), and its ops keep torch's shapes (SDPA returns the
rank it is given), so the rivals' glue (views, reshapes back to the reference's shape, dtypes) is
tested without torch installed. Installed into sys.modules by tests/test_bench_cases.py."""
import contextlib
import types

import numpy as np

from silkattn import reference as ref


class Tensor(np.ndarray):
    def numpy(self):
        return np.asarray(self)

    def requires_grad_(self, flag=True):
        return self


def _tensor(a):
    return np.asarray(a).view(Tensor)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch's rules: attn_mask bool (True: the key takes part) or float (added to the scores, in
    the query's dtype), never with is_causal (top-left); fewer K/V heads only with enable_gqa."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    assert dropout_p == 0.0
    if k.shape[-3:-2] != q.shape[-3:-2] and not enable_gqa:
        raise RuntimeError(f"SDPA without enable_gqa needs as many K/V heads as Q's: {q.shape}, {k.shape}")
    mask = bias = None
    if attn_mask is not None:
        if is_causal:
            raise RuntimeError("Explicit attn_mask should not be set when is_causal=True")
        attn_mask = np.asarray(attn_mask)
        if attn_mask.dtype == bool:
            mask = attn_mask
        else:
            assert attn_mask.dtype == q.dtype, ("a float attn_mask in the query's dtype", attn_mask.dtype)
            bias = attn_mask
    elif is_causal:
        mask = ref.causal_mask(q.shape[-2], k.shape[-2])  # top-left, as torch's
    out = _tensor(ref.attention(q, k, v, mask, scale=scale, bias=bias))
    out.sdpa_inputs = (q, k, v, mask, scale, bias)  # what _grad differentiates
    return out


def _grad(outputs, inputs, grad_outputs, retain_graph=False):
    """torch.autograd.grad of an SDPA output with respect to its (q, k, v), by the reference."""
    q, k, v, mask, scale, bias = outputs.sdpa_inputs
    out, lse = ref.attention(q, k, v, mask, scale=scale, bias=bias, return_lse=True)
    grads = ref.attention_backward(np.asarray(grad_outputs), q, k, v, out, lse, mask, scale=scale, bias=bias)
    return tuple(_tensor(g) for g in grads)


def _layer_norm(x, shape, weight, bias, eps=1e-5):
    assert tuple(shape) == x.shape[-1:]
    return _tensor(ref.layer_norm(np.asarray(x), np.asarray(weight), np.asarray(bias), eps))


functional = types.ModuleType("torch.nn.functional")
functional.scaled_dot_product_attention = _sdpa
functional.layer_norm = _layer_norm
nn = types.ModuleType("torch.nn")
nn.functional = functional
torch = types.ModuleType("torch")
torch.nn = nn
torch.from_numpy = _tensor
torch.inference_mode = contextlib.nullcontext
torch.set_num_threads = lambda n: None
torch.softmax = lambda x, dim: _tensor(ref.softmax(np.moveaxis(np.asarray(x), dim, -1))).swapaxes(dim, -1)
torch.relu = lambda x: np.maximum(x, 0)
torch.empty = lambda shape, dtype: _tensor(np.empty(shape, dtype))
torch.matmul = lambda a, b, out=None: np.matmul(a, b, out=out)
torch.argmax = np.argmax
torch.tensor = _tensor
torch.autograd = types.SimpleNamespace(grad=_grad)
MODULES = {"torch": torch, "torch.nn": nn, "torch.nn.functional": functional}
