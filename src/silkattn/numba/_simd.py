"""The small SIMD layer every Numba kernel module of silkattn.numba shares.

A numba type for one SIMD register (VBYTES: 64 bytes, <16 x float> / <8 x double>, where the CPU
has AVX-512F, else 32) and @intrinsic operations on it (loads, stores, FMAs, lane sums, a vector
exp, GGUF blocks' bytes and float16 scales, prefetches), so the register-tiled micro-kernels keep
their accumulators in registers (LLVM
only vectorises innermost loops by itself, which makes plain loops round-trip their accumulators
through L1) and exp is a vectorised polynomial (math.exp stays a scalar libm call here: no SVML in
this llvmlite). With NUMBA_DISABLE_JIT=1 the same names are plain NumPy functions on small arrays,
so the kernel source still runs (slowly) as Python.
"""
import math
import os

import numba
import numpy as np

from ._jit import jit

# fastmath: 'contract' only (a * b + c may become one FMA). Not True, nor 'nnan'/'ninf': they let LLVM
# assume no NaN or Inf, so the -inf running-max start, the -inf padding and NaN inputs would become
# undefined. Not 'reassoc' either, which the hand-vectorised code does not need (it makes its own
# register-wide partial sums) and which would be harmful: Numba applies the flags to every float
# instruction of a function, the intrinsics' too, and re-association would fold the two-step range
# reduction of exp (x - n*C1 - n*C2) and layer_norm's shifted centring ((x - x0) - delta).
FASTMATH = {"contract"}


def _vector_bytes():
    """(bytes of one SIMD register, whether the user forced it): 64 where the CPU has AVX-512F
    (llvmlite emits zmm code), else 32 (AVX2); SILKATTN_NUMBA_VBYTES=32|64 forces one. 64 on a CPU
    without AVX-512 runs the 16-lane code with each operation split in two (as tests do)."""
    forced = os.environ.get("SILKATTN_NUMBA_VBYTES", "").strip()
    if forced:
        if forced not in ("32", "64"):
            raise ImportError(f"SILKATTN_NUMBA_VBYTES must be 32 or 64, got {forced!r}")
        return int(forced), True
    try:
        from llvmlite import binding
        return (64 if binding.get_host_cpu_features().get("avx512f") else 32), False
    except Exception:  # an llvmlite without the query: the AVX2 width
        return 32, False


VBYTES, _FORCED = _vector_bytes()


def _f16c():
    """(whether the CPU converts float16 in hardware as LLVM knows it, x86's F16C; whether the user
    forced it off): vload_halves converts with one instruction a register, else with integer
    operations (without F16C, LLVM would call a compiler-rt routine the JIT may not have).
    SILKATTN_NUMBA_F16C=0 forces the integer operations (as a test does)."""
    if os.environ.get("SILKATTN_NUMBA_F16C", "").strip() == "0":
        return False, True
    try:
        from llvmlite import binding
        return bool(binding.get_host_cpu_features().get("f16c")), False
    except Exception:
        return False, False


F16C, _F16C_FORCED = _f16c()
# Numba's on-disk cache is keyed by the CPU, not by VBYTES (nor F16C): a forced choice compiles
# afresh each time.
CACHE = not (_FORCED or _F16C_FORCED)

if numba.config.DISABLE_JIT:
    # ---- pure-Python stand-ins: a "vector" is a small NumPy array of one register's lanes ----
    def vwidth(a):
        return VBYTES // a.dtype.itemsize

    def vload(a, i):
        return a[i:i + VBYTES // a.dtype.itemsize].copy()

    def vstore(a, i, v):
        a[i:i + v.size] = v

    def vsplat(a, x):
        return np.full(VBYTES // a.dtype.itemsize, x, a.dtype)

    def vbcast(a, i):
        return np.full(VBYTES // a.dtype.itemsize, a[i], a.dtype)

    def vfma(x, y, z):
        return x * y + z

    def vadd(x, y):
        return x + y

    def vmul(x, y):
        return x * y

    def vsub(x, y):
        return x - y

    def vdiv(x, y):
        return x / y

    def vmax(x, y):
        return np.where(y > x, y, x)

    def vmin(x, y):
        return np.where(y < x, y, x)

    def hsum(v):
        return v.sum(dtype=v.dtype)

    def hmax(v):
        return v.max()

    def vget(v, i):
        return v[i]

    def vsum4(a, b, c, d):
        return np.concatenate([[a.sum(dtype=a.dtype), b.sum(dtype=a.dtype), c.sum(dtype=a.dtype),
                                d.sum(dtype=a.dtype)], np.zeros(a.size - 4, a.dtype)]).astype(a.dtype)

    def vload_q8(like, a, i):
        return a[i:i + VBYTES // like.dtype.itemsize].view(np.int8).astype(like.dtype)

    def vload_q4(like, a, i, shift):
        return ((a[i:i + VBYTES // like.dtype.itemsize] >> shift) & 15).astype(like.dtype)

    def viota(like):
        return np.arange(VBYTES // like.dtype.itemsize).astype(like.dtype)

    def vprefetch(a, i):
        pass

    def vtable_q4(table, a, i):
        return table[a[i:i + table.size] & 15], table[a[i:i + table.size] >> 4]

    def vload_halves(like, a, i, stride, count):
        lanes = np.arange(VBYTES // like.dtype.itemsize)
        at = i + np.minimum(lanes, count - 1) * stride

        def half(at):
            h = (a[at].astype(np.uint16) | a[at + 1].astype(np.uint16) << 8).view(np.float16)
            return np.where(lanes < count, h.astype(like.dtype), 0).astype(like.dtype)
        return half(at), half(at + 2)

    def vexp(v):
        lo = -87.33654 if v.dtype == np.float32 else -708.0
        with np.errstate(under="ignore", over="ignore"):
            hi = 88.0 if v.dtype == np.float32 else 709.0
            return np.where(v < lo, 0, np.exp(np.minimum(v, hi))).astype(v.dtype)
else:
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic, models, register_model

    LANES = {types.float32: VBYTES // 4, types.float64: VBYTES // 8}

    class Vec(types.Type):
        """One SIMD register of `lanes` x `dtype` (a plain LLVM vector value)."""

        def __init__(self, dtype, lanes):
            self.dtype, self.lanes = dtype, lanes
            super().__init__(name=f"Vec({dtype} x {lanes})")

    @register_model(Vec)
    class VecModel(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            lane = dmm.lookup(fe_type.dtype).get_value_type()
            super().__init__(dmm, fe_type, ir.VectorType(lane, fe_type.lanes))

    def _vec_of(dtype):
        return Vec(dtype, LANES[dtype]) if dtype in LANES else None

    def _ll(context, vt):
        return ir.VectorType(context.get_value_type(vt.dtype), vt.lanes)

    def _splat_value(builder, llvec, x):
        undef = ir.Constant(llvec, ir.Undefined)
        v = builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
        zeros = ir.Constant(ir.VectorType(ir.IntType(32), llvec.count), [0] * llvec.count)
        return builder.shuffle_vector(v, undef, zeros)

    def _const(llvec, x):
        return ir.Constant(llvec, [x] * llvec.count)

    def _vptr(context, builder, arytype, ary, idx, idxtype, llvec):
        a = context.make_array(arytype)(context, builder, ary)
        i = context.cast(builder, idx, idxtype, types.intp)
        return builder.bitcast(builder.gep(a.data, [i]), ir.PointerType(llvec))

    @intrinsic
    def vwidth(typingctx, a):
        """Lanes per register for a's dtype (a compile-time constant)."""
        vt = _vec_of(getattr(a, "dtype", None))
        if vt is None:
            return None

        def codegen(context, builder, sig, args):
            return ir.Constant(ir.IntType(64), vt.lanes)
        return types.intp(a), codegen

    @intrinsic
    def vload(typingctx, a, i):
        """Unaligned load of one register from a 1-D C array at element i."""
        if not isinstance(a, types.Array) or _vec_of(a.dtype) is None:
            return None
        vt = _vec_of(a.dtype)

        def codegen(context, builder, sig, args):
            llvec = _ll(context, vt)
            return builder.load(_vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], llvec),
                                align=vt.dtype.bitwidth // 8)
        return vt(a, i), codegen

    @intrinsic
    def vstore(typingctx, a, i, v):
        if not isinstance(a, types.Array) or _vec_of(a.dtype) is None or v != _vec_of(a.dtype):
            return None

        def codegen(context, builder, sig, args):
            llvec = _ll(context, sig.args[2])
            builder.store(args[2], _vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], llvec),
                          align=sig.args[2].dtype.bitwidth // 8)
            return context.get_dummy_value()
        return types.none(a, i, v), codegen

    def _bytes_at(context, builder, sig, args, vt):
        """The register's worth of bytes of the uint8 array args[1] from byte args[2] (any address)."""
        ptr = _vptr(context, builder, sig.args[1], args[1], args[2], sig.args[2],
                    ir.VectorType(ir.IntType(8), vt.lanes))
        return builder.load(ptr, align=1)

    @intrinsic
    def vload_q8(typingctx, like, a, i):
        """float(int8(a[i + l])) in lane l of a register of like's dtype: a's uint8 bytes as the int8
        q of a Q8_0 block (one vpmovsxbd and a conversion)."""
        vt = _vec_of(getattr(like, "dtype", None))
        if vt is None or not isinstance(a, types.Array) or a.dtype != types.uint8:
            return None

        def codegen(context, builder, sig, args):
            return builder.sitofp(_bytes_at(context, builder, sig, args, vt), _ll(context, vt))
        return vt(like, a, i), codegen

    @intrinsic
    def vload_q4(typingctx, like, a, i, shift):
        """float((a[i + l] >> shift) & 15) in lane l of a register of like's dtype: the low (shift 0) or
        high (shift 4) nibbles of a 4-bit block's bytes."""
        vt = _vec_of(getattr(like, "dtype", None))
        if vt is None or not isinstance(a, types.Array) or a.dtype != types.uint8:
            return None

        def codegen(context, builder, sig, args):
            i8 = ir.IntType(8)
            byte = _bytes_at(context, builder, sig, args, vt)
            count = builder.trunc(context.cast(builder, args[3], sig.args[3], types.int64), i8)
            nibble = builder.and_(builder.lshr(byte, _splat_value(builder, byte.type, count)),
                                  _const(byte.type, 15))
            return builder.uitofp(nibble, _ll(context, vt))
        return vt(like, a, i, shift), codegen

    @intrinsic
    def vprefetch(typingctx, a, i):
        """A hint to bring the cache line of a[i] (1-D C array) into the caches: a software prefetch
        into L2 (prefetcht2 on x86: not L1, whose few miss buffers the loads need), which never
        faults (any i)."""
        if not isinstance(a, types.Array):
            return None

        def codegen(context, builder, sig, args):
            i8, i32 = ir.IntType(8), ir.IntType(32)
            ptr = builder.bitcast(_vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1],
                                        context.get_value_type(sig.args[0].dtype)), ir.PointerType(i8))
            # (read, locality 1, data cache); the name LLVM 14 spells, which later ones upgrade
            fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
            builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 1), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.none(a, i), codegen

    @intrinsic
    def viota(typingctx, like):
        """A register of like's dtype with lane l holding l."""
        vt = _vec_of(getattr(like, "dtype", None))
        if vt is None:
            return None

        def codegen(context, builder, sig, args):
            return ir.Constant(_ll(context, vt), list(range(vt.lanes)))
        return vt(like), codegen

    @intrinsic
    def vtable_q4(typingctx, table, a, i):
        """Two registers, lane l of the first table's lane a[i + l] & 15, of the second its lane
        a[i + l] >> 4, for table a 16-lane register: the low and high nibbles of a 4-bit block's
        bytes looked up in a register of their 16 values. Written as lanes extracted by a variable
        index, which LLVM's x86 backend lowers to a variable permute (vpermps/vpermd) with
        AVX-512; the bytes widened once for both (two calls, one a half, had LLVM widen them
        twice, after narrowing the mask and shift to bytes: two more instructions a block)."""
        if not isinstance(table, Vec) or table.lanes != 16 or not isinstance(a, types.Array) \
                or a.dtype != types.uint8:
            return None

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            ivec = ir.VectorType(i32, 16)
            word = builder.zext(_bytes_at(context, builder, sig, args, table), ivec)

            def lookup(idx):
                out = ir.Constant(args[0].type, ir.Undefined)
                for lane in range(16):
                    n = ir.Constant(i32, lane)
                    out = builder.insert_element(out, builder.extract_element(
                        args[0], builder.extract_element(idx, n)), n)
                return out
            pair = [lookup(builder.and_(word, _const(ivec, 15))),
                    lookup(builder.lshr(word, _const(ivec, 4)))]
            return context.make_tuple(builder, sig.return_type, pair)
        return types.UniTuple(table, 2)(table, a, i), codegen

    @intrinsic
    def vload_halves(typingctx, like, a, i, stride, count):
        """Two registers of like's dtype, lane l < count of each the little-endian float16 at bytes
        i + l stride (the first) and i + l stride + 2 (the second) of the uint8 array a; lanes from
        count: 0 (they read lane count - 1's bytes, the caller's last valid ones, even for count <=
        0). The scales of GGUF blocks stride bytes apart (d, Q4_1's m), a register at a time: one
        32-bit word a lane loaded lane by lane (no gather instruction: slower than this on AMD's
        Zen 4), its halves converted by F16C where the CPU has it, else with integer operations;
        exact either way, in every case (normal, subnormal, zero, inf, NaN). An unused second
        register costs nothing (LLVM drops it)."""
        vt = _vec_of(getattr(like, "dtype", None))
        if vt is None or not isinstance(a, types.Array) or a.dtype != types.uint8:
            return None

        def codegen(context, builder, sig, args):
            L = vt.lanes
            i32, i64 = ir.IntType(32), ir.IntType(64)
            ivec, fvec = ir.VectorType(i32, L), ir.VectorType(ir.FloatType(), L)
            arr = context.make_array(sig.args[1])(context, builder, args[1])
            i, stride, count = (context.cast(builder, v, t, types.int64)
                                for v, t in zip(args[2:], sig.args[2:]))
            first = builder.add(builder.ptrtoint(arr.data, i64), i)

            def gather(clamp):
                word = ir.Constant(ivec, ir.Undefined)
                for lane in range(L):
                    index = ir.Constant(i64, lane)
                    if clamp:  # lanes from count read lane count - 1's word
                        index = builder.select(builder.icmp_signed("<", index, count), index,
                                               builder.sub(count, ir.Constant(i64, 1)))
                    at = builder.inttoptr(builder.add(first, builder.mul(index, stride)), ir.PointerType(i32))
                    word = builder.insert_element(word, builder.load(at, align=1), ir.Constant(i32, lane))
                return word
            with builder.if_else(builder.icmp_signed(">=", count, ir.Constant(i64, L)), likely=True) as (
                    whole, part):
                with whole:  # the usual case: L lanes, no clamping
                    word_whole, from_whole = gather(False), builder.block
                with part:
                    word_part, from_part = gather(True), builder.block
            word = builder.phi(ivec)
            word.add_incoming(word_whole, from_whole)
            word.add_incoming(word_part, from_part)
            few = builder.trunc(builder.select(builder.icmp_signed("<", count, ir.Constant(i64, L)), count,
                                               ir.Constant(i64, L)), i32)
            valid = builder.icmp_signed("<", ir.Constant(ivec, list(range(L))),
                                        _splat_value(builder, ivec, few))

            def half(h):
                if F16C:  # vpmovdw and vcvtph2ps (exact)
                    h16 = builder.trunc(h, ir.VectorType(ir.IntType(16), L))
                    f = builder.fpext(builder.bitcast(h16, ir.VectorType(ir.HalfType(), L)), _ll(context, vt))
                    return builder.select(valid, f, _const(f.type, 0.0))
                # exponent and fraction moved to a float's places and the exponent rebiased (15 -> 127);
                # exponent 31 (inf, NaN) rebiased once more to 255; exponent 0 (zero, subnormal f 2^-24):
                # 2^-14 (1 + f / 1024) - 2^-14, exactly
                o = builder.shl(builder.and_(h, _const(ivec, 0x7FFF)), _const(ivec, 13))
                e = builder.and_(o, _const(ivec, 0x0F800000))
                o = builder.add(o, _const(ivec, 112 << 23))
                o = builder.select(builder.icmp_unsigned("==", e, _const(ivec, 0x0F800000)),
                                   builder.add(o, _const(ivec, 112 << 23)), o)
                sub = builder.fsub(builder.bitcast(builder.add(o, _const(ivec, 1 << 23)), fvec),
                                   _const(fvec, 2.0 ** -14))
                f = builder.select(builder.icmp_unsigned("==", e, _const(ivec, 0)), sub,
                                   builder.bitcast(o, fvec))
                sign = builder.shl(builder.and_(h, _const(ivec, 0x8000)), _const(ivec, 16))
                f = builder.bitcast(builder.or_(builder.bitcast(f, ivec), sign), fvec)
                f = builder.select(valid, f, _const(fvec, 0.0))
                return f if vt.dtype == types.float32 else builder.fpext(f, _ll(context, vt))
            pair = [half(builder.and_(word, _const(ivec, 0xFFFF))),
                    half(builder.lshr(word, _const(ivec, 16)))]
            return context.make_tuple(builder, sig.return_type, pair)
        return types.UniTuple(vt, 2)(like, a, i, stride, count), codegen

    @intrinsic
    def vbcast(typingctx, a, i):
        """A register with every lane a[i] (1-D C array; no negative-index wraparound)."""
        if not isinstance(a, types.Array) or _vec_of(a.dtype) is None:
            return None
        vt = _vec_of(a.dtype)

        def codegen(context, builder, sig, args):
            llvec = _ll(context, vt)
            ptr = _vptr(context, builder, sig.args[0], args[0], args[1], sig.args[1], llvec.element)
            return _splat_value(builder, llvec, builder.load(ptr, align=vt.dtype.bitwidth // 8))
        return vt(a, i), codegen

    @intrinsic
    def vsplat(typingctx, a, x):
        """A register of a's dtype with every lane x."""
        vt = _vec_of(getattr(a, "dtype", None))
        if vt is None or not isinstance(x, (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            s = context.cast(builder, args[1], sig.args[1], vt.dtype)
            return _splat_value(builder, _ll(context, vt), s)
        return vt(a, x), codegen

    def _binary(op):
        @intrinsic
        def f(typingctx, x, y):
            if not isinstance(x, Vec) or x != y:
                return None

            def codegen(context, builder, sig, args):
                return op(builder, *args)
            return x(x, y), codegen
        return f

    vadd = _binary(lambda b, x, y: b.fadd(x, y))
    vmul = _binary(lambda b, x, y: b.fmul(x, y))
    vsub = _binary(lambda b, x, y: b.fsub(x, y))
    vdiv = _binary(lambda b, x, y: b.fdiv(x, y))
    # max(x, y) as "y > x ? y : x": a NaN in y is dropped here, but the same NaN still reaches
    # exp(y - m) and so the row sum and the output, which end up NaN as in the reference.
    vmax = _binary(lambda b, x, y: b.select(b.fcmp_ordered(">", y, x), y, x))
    vmin = _binary(lambda b, x, y: b.select(b.fcmp_ordered("<", y, x), y, x))  # likewise keeps a NaN in x

    @intrinsic
    def vfma(typingctx, x, y, z):
        """x * y + z with one rounding (a vector FMA)."""
        if not isinstance(x, Vec) or not x == y == z:
            return None

        def codegen(context, builder, sig, args):
            return _fma(builder, *args)
        return x(x, y, z), codegen

    def _vintrinsic(builder, name, args):
        t = args[0].type
        full = f"llvm.{name}.v{t.count}f{64 if isinstance(t.element, ir.DoubleType) else 32}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t] * len(args)), full)
        return builder.call(fn, args)

    def _fma(builder, x, y, z):
        return _vintrinsic(builder, "fma", [x, y, z])

    def _reduce(builder, v, combine):
        # fixed pairwise tree: the same order on every call, so results never depend on threads
        n = v.type.count
        while n > 1:
            n //= 2
            lanes = ir.VectorType(ir.IntType(32), n)
            lo = builder.shuffle_vector(v, v, ir.Constant(lanes, list(range(n))))
            hi = builder.shuffle_vector(v, v, ir.Constant(lanes, list(range(n, 2 * n))))
            v = combine(lo, hi)
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))

    @intrinsic
    def hsum(typingctx, v):
        if not isinstance(v, Vec):
            return None

        def codegen(context, builder, sig, args):
            return _reduce(builder, args[0], builder.fadd)
        return v.dtype(v), codegen

    @intrinsic
    def hmax(typingctx, v):
        if not isinstance(v, Vec):
            return None

        def codegen(context, builder, sig, args):
            def larger(x, y):
                return builder.select(builder.fcmp_ordered(">", y, x), y, x)
            return _reduce(builder, args[0], larger)
        return v.dtype(v), codegen

    @intrinsic
    def vget(typingctx, v, i):
        """Lane i of v."""
        if not isinstance(v, Vec) or not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))
        return v.dtype(v, i), codegen

    @intrinsic
    def vsum4(typingctx, a, b, c, d):
        """Lanes 0..3: the lane sums of a, b, c and d, by a transpose of shuffles and adds (pairs of
        lanes, then pairs of pairs, then halves folded); the other lanes are left undefined."""
        if not isinstance(a, Vec) or not a == b == c == d or a.lanes < 4:
            return None

        def codegen(context, builder, sig, args):
            W = sig.args[0].lanes

            def lanes(idx):
                return ir.Constant(ir.VectorType(ir.IntType(32), W), idx)

            def level(x, y, B):  # lane i: lanes i and i + B of x (even blocks of B) or y (odd blocks)
                lo = [i if (i // B) % 2 == 0 else W + i - B for i in range(W)]
                return builder.fadd(builder.shuffle_vector(x, y, lanes(lo)),
                                    builder.shuffle_vector(x, y, lanes([t + B for t in lo])))
            x = level(level(args[0], args[1], 1), level(args[2], args[3], 1), 2)
            half = W // 2
            while half >= 4:
                x = builder.fadd(x, builder.shuffle_vector(x, x, lanes([(i + half) % W for i in range(W)])))
                half //= 2
            return x
        return a(a, b, c, d), codegen

    @intrinsic
    def vexp(typingctx, v):
        """exp on every lane: Cephes-style range reduction, a polynomial, 2^n built in the exponent bits.

        float32: degree-7 Cephes expf polynomial (~1-2 ulp); float64: degree-12 Taylor on |r| <= ln2/2
        (~2 ulp). Arguments below the smallest normal result give exactly 0 (so -inf gives 0). Only
        for x <= 0, which is what the kernels pass (a score minus the running max), or a small
        positive x (attention's float64 softcap passes x <= 40): nothing is clamped at the top, where
        2^n would overflow the exponent field.
        """
        if not isinstance(v, Vec):
            return None

        def codegen(context, builder, sig, args):
            x = args[0]
            llvec = x.type
            f32 = sig.args[0].dtype == types.float32
            if f32:
                lo, c1, c2 = -87.33654, 0.693359375, -2.12194440e-4
                poly = [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                        1.6666665459e-1, 5.0000001201e-1]
                ity, bias, shift = ir.IntType(32), 127, 23
            else:
                lo, c1, c2 = -708.0, 6.93145751953125e-1, 1.42860682030941723212e-6
                poly = [1.0 / math.factorial(k) for k in range(12, 1, -1)]
                ity, bias, shift = ir.IntType(64), 1023, 52
            ivec = ir.VectorType(ity, llvec.count)
            def C(c):
                return _const(llvec, c)
            under = builder.fcmp_ordered("<", x, C(lo))
            xc = builder.select(under, C(lo), x)  # no upper clamp: callers pass x <= 0 (see above)
            fx = _vintrinsic(builder, "floor", [_fma(builder, xc, C(1.4426950408889634), C(0.5))])
            r = _fma(builder, fx, C(-c1), xc)
            r = _fma(builder, fx, C(-c2), r)
            p = C(poly[0])
            for c in poly[1:]:
                p = _fma(builder, p, r, C(c))
            y = builder.fadd(_fma(builder, p, builder.fmul(r, r), r), C(1.0))
            n = builder.fptosi(fx, ivec)
            biased = builder.add(n, _const(ivec, bias))
            pow2 = builder.bitcast(builder.shl(biased, _const(ivec, shift)), llvec)
            return builder.select(under, C(0.0), builder.fmul(y, pow2))
        return v(v), codegen


@jit(inline="always", fastmath=FASTMATH)
def vexp_sub(src, si, dst, di, n, m):
    """dst[di + j] = exp(src[si + j] - m) for j < n (a whole number of registers; src may be dst);
    returns the register of their partial sums. The softmax's exp pass, for every kernel that has one."""
    W = vwidth(src)
    vm = vsplat(src, m)
    vneg = vsplat(src, -1.0)
    sm = vsplat(src, 0)
    for j in range(0, n, W):
        e = vexp(vfma(vm, vneg, vload(src, si + j)))
        vstore(dst, di + j, e)
        sm = vadd(sm, e)
    return sm
