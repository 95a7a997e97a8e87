"""ggml's AVX2 products of a Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS row with a Q8_K token (llama.cpp 0.3.36's ggml-cpu
arch/x86/quants.c `ggml_vec_dot_<type>_q8_K`), rebuilt as numba intrinsics, for the simulator's llama.cpp plans that
keep these types in place (calibration.bench_rowwise).

llama.cpp's MUL_MAT_ID quantises the token to Q8_K (int8 codes, one float scale and sixteen int16 16-code sums a
256-value super-block) and dots each row with it. Per super-block:
- Q4_K: the 12 bytes of 6-bit scales and mins unpacked (the `utmp` shuffle) and widened to 16 bits; the mins times the
  token's 32-code sums (`vpmaddwd` on 128 bits) into a 4-lane accumulator with -dmin times the token's scale; four
  passes of 32 bytes of nibbles, the low and high nibbles against 32 codes each by `vpmaddubsw`, each times its
  sub-block's scale (`vpshufb`) by `vpmaddwd`, summed in 32-bit lanes; one convert and fused multiply-add with d times
  the token's scale into 8 lanes.
- Q5_K: Q4_K's, each value's fifth bit from qh added, and the mins' sum fused-added in one scalar float.
- Q6_K: the 6-bit values (0-63) built from ql's nibbles and qh's bit pairs, two passes of four 32-value products, each
  times its sign-extended int8 scale, less 32 x the scales times the token's 16-code sums (the values' -32 offset).
- IQ4_XS: each nibble looked up in the IQ4_NL codebook by `vpshufb`, the int8 products by `vpsignb` / `vpmaddubsw`,
  each 32 values times its 6-bit scale less 32, even and odd sub-blocks in two sums.
- Q2_K: the 4-bit mins times the token's 16-code sums into the 8 float lanes first (with -dmin); then two passes of
  32 bytes, each byte four 2-bit values, each 16 values times its 4-bit scale.
- Q3_K: Q2_K's passes on the low 2 bits, less a second product of 4 where a value's high bit (hmask) is clear; the
  scales 6-bit, less 32; no mins.
ggml compiles these loops for every CPU with AVX2 (there is no AVX-512 or VNNI form of them); the sums at the end are
ggml's (hsum_float_8, then the mins), so the products are ggml's to the bit (tests/calibration/test_ggml_vec_dot_k.py,
against a llama.cpp build where one is found).

In L2 on the Zen 4 VM (one thread, 96 rows of 2048, ggml's own kernels called from numba beside them, 2026-12-06) a
row takes, rebuilt against ggml's own: Q4_K 54-57 ns against 54-56, Q6_K 54-60 against 56-57, IQ4_XS 75 against 84,
Q5_K 67-73 against 81-83. For Q4_K and Q6_K three things had to match ggml's code: the token's sums read as int16
(narrowed from int32 in the loop, each super-block paid a 512-bit `vpmovdw`), the scales broadcast by `vpshufb` (LLVM
had made a shift and a `vpbroadcastw` of each), and each `vpmaddwd` kept apart from the add after it (`_freeze`).
Q5_K's ran faster: LLVM merged its fifth bit's two shifts and folded the add of disjoint bits and the mask into one
`vpternlogq`, which GCC does not; with those steps kept apart by `_opaque` (an empty inline assembly statement) it
runs 77-79 ns against 81-85. Q2_K's row takes 44-48 ns against 46-50, Q3_K's 73 against 72-76 (Q3_K's high-bit
shifts `_opaque` too; merged, 66-68). Before these rebuilds llama.cpp's in-place rows of these types took the
executor's int16 rows' rate: in calibrate's decode job on one thread 14.4 GB/s of Q4_K and 15.4 of Q6_K, where ggml's own kernels
read 17.5-17.8 and 24.4-24.9 and the rebuilds 17.7-18.1 and 24.8 (17:26-17:31, `python benchmarks/bench_ggml_own.py
--threads 1 --rounds 7 --formats Q4_K Q6_K`, medians of alternating rounds); Q2_K's and Q3_K's 8.0-8.1 and 8.7-8.8
in calibrate's profiles, where the rebuilds read 13.1 and 11.7 (ggml's own in the same job 12.5 and 10.9-11.0).
AVX2 only.
"""
from __future__ import annotations

from functools import partial

from llvmlite import ir
from numba.core import cgutils

from executor.nbcache import drop_stale_cache
from executor.iquants import KVALUES
from executor.simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fn, _splat

from .ggml_vec_dot import fp16_lookup
from .ggml_gemv_kx8 import Ops, load_vec, q8_k_intrinsic, shift_bytes, utmp_scales_mins, v32

drop_stale_cache(__file__)

Q4_K_BYTES = 144  # block_q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
Q6_K_BYTES = 210  # block_q6_K: 128 bytes of low nibbles (ql), 64 of high bit pairs (qh), 16 int8 scales, fp16 d
Q5_K_BYTES = 176  # block_q5_K: fp16 d, fp16 dmin, 12 bytes of scales and mins, 32 of fifth bits (qh), 128 of nibbles
IQ4_XS_BYTES = 136  # block_iq4_xs: fp16 d, uint16 scales_h, 4 bytes scales_l, 128 of nibbles
Q2_K_BYTES = 84  # block_q2_K: 16 bytes of 4-bit scales (low) and mins (high), 64 of 2-bit values, fp16 d, fp16 dmin
Q3_K_BYTES = 110  # block_q3_K: 32 bytes of high bits (hmask), 64 of 2-bit low bits, 12 of 6-bit scales, fp16 d


def _scales_mins(builder, p):
    """Codegen: the 12 bytes at p+4 -> <16 x i16>: the 8 sub-blocks' scales, then their mins (ggml's utmp shuffle,
    then _mm256_cvtepu8_epi16)."""
    return builder.zext(utmp_scales_mins(builder, builder.gep(p, [ir.Constant(I64, 4)])), V(I16, 16))


def _freeze(builder, v):
    """Codegen: `freeze v`, the same value, which instruction selection does not look through. Without it, on a VNNI
    CPU LLVM fuses each vpmaddwd with the add after it into a vpdpwssd, eight in one dependent chain a super-block,
    where ggml's GCC build keeps its vpmaddwd and a chain of vpaddd. (InstCombine moves a freeze of a shift or a mask
    onto its operand, so those steps take _opaque.)"""
    instr = ir.instructions.Instruction(builder.block, v.type, "freeze", [v])
    builder._insert(instr)
    return instr


def _opaque(builder, v):
    """Codegen: v through an empty inline assembly statement, in the same register: a value LLVM cannot see into, so
    it keeps the steps on either side apart (it would merge two shifts into one, as GCC does not)."""
    asm = ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=x,0", side_effect=False)
    return builder.call(asm, [v])


class _Tools:
    """What a super-block's codegen uses: the builder, ggml's integer intrinsics and the token's pointers."""

    def __init__(self, builder, xd, bd):
        self.b, self.xd, self.bd = builder, xd, bd
        ops = Ops(builder)
        self.maddubs, self.pmaddwd = ops.maddubs, ops.pmaddwd
        self.pshufb = _fn(builder, "llvm.x86.avx2.pshuf.b", V(I8, 32), [V(I8, 32)] * 2)
        self.pshufb128 = _fn(builder, "llvm.x86.ssse3.pshuf.b.128", V(I8, 16), [V(I8, 16)] * 2)
        self.madd128 = _fn(builder, "llvm.x86.sse2.pmadd.wd", V(I32, 4), [V(I16, 8)] * 2)
        self.psign = _fn(builder, "llvm.x86.avx2.psign.b", V(I8, 32), [V(I8, 32)] * 2)

    def i64(self, v):
        return ir.Constant(I64, v)

    def half(self, q, at):
        """The fp16 at byte `at` of q, as float, looked up in ggml's table as GGML_CPU_FP16_TO_FP32 does."""
        return fp16_lookup(self.b, self.b.gep(q, [self.i64(at)]))

    def scaled(self, scale, vals, codes):
        """vpmaddwd(scale, vpmaddubsw(vals, codes)), frozen (_freeze)."""
        return _freeze(self.b, self.b.call(self.pmaddwd, [scale, self.b.call(self.maddubs, [vals, codes])]))

    def codes(self, b, at):
        """The token's 32 codes at value `at` of super-block b."""
        return load_vec(self.b, self.xd, self.b.add(self.b.mul(b, self.i64(256)), self.i64(at)), V(I8, 32))

    def sums(self, b):
        """The token's sixteen int16 16-code sums of super-block b."""
        return load_vec(self.b, self.bd, self.b.mul(b, self.i64(16)), V(I16, 16), 2)


def _k4_header(t: _Tools, p, b, dy):
    """Codegen: what Q4_K's and Q5_K's loops take from a super-block's head: (d, dmin, scale(s) -> sub-block s's scale
    in every 16-bit lane, <4 x i32> mins x the token's 32-code sums)."""
    bld = t.b
    d, dmin = bld.fmul(dy, t.half(p, 0)), bld.fmul(bld.fneg(dy), t.half(p, 2))
    sm = _scales_mins(bld, p)
    sc = bld.bitcast(bld.shuffle_vector(sm, sm, v32(list(range(8)) * 2)), V(I8, 32))  # MM256_SET_M128I

    def scale(s):  # _mm256_shuffle_epi8(scales, get_scale_shuffle_k4(s))
        return bld.bitcast(bld.call(t.pshufb, [sc, ir.Constant(V(I8, 32), [2 * s, 2 * s + 1] * 16)]), V(I16, 16))
    bs = t.sums(b)
    q8s = bld.add(bld.shuffle_vector(bs, bs, v32(range(0, 16, 2))),  # _mm_hadd_epi16 of the two halves
                  bld.shuffle_vector(bs, bs, v32(range(1, 16, 2))))
    return d, dmin, scale, bld.call(t.madd128, [bld.shuffle_vector(sm, sm, v32(range(8, 16))), q8s])


def _q4_k_block(t: _Tools, p, b, dy):
    """Codegen: (d, <8 x i32> sums, ('lanes', dmin, <4 x i32> mins x code sums)) of Q4_K super-block b at p (ggml's
    AVX2 loop)."""
    bld = t.b
    d, dmin, scale, prod = _k4_header(t, p, b, dy)
    low = ir.Constant(V(I8, 32), [0x0F] * 32)
    sumi = ir.Constant(V(I32, 8), [0] * 8)
    for j in range(4):  # 64 values a pass: sub-block 2j in the low nibbles, 2j + 1 in the high
        q4 = load_vec(bld, p, t.i64(16 + 32 * j), V(I8, 32))
        q4l, q4h = bld.and_(q4, low), bld.and_(shift_bytes(bld, q4, 4), low)
        p16 = [t.scaled(scale(s), vals, t.codes(b, 64 * j + 32 * h))
               for h, (vals, s) in enumerate(((q4l, 2 * j), (q4h, 2 * j + 1)))]
        sumi = bld.add(sumi, bld.add(p16[0], p16[1]))
    return d, sumi, ("lanes", dmin, prod)


def _shift16(bld, v, bits):
    """_mm256_slli_epi16 (bits > 0) / _mm256_srli_epi16 (bits < 0) of a <32 x i8>."""
    w = bld.bitcast(v, V(I16, 16))
    k = ir.Constant(V(I16, 16), [abs(bits)] * 16)
    return bld.bitcast(bld.shl(w, k) if bits > 0 else bld.lshr(w, k), V(I8, 32))


def _q6_k_block(t: _Tools, p, b, dy):
    """Codegen: (d, <8 x i32> sums, None) of Q6_K super-block b at p (ggml's AVX2 loop: 6-bit values 0-63 from ql
    and qh, the -32 offset taken off at the end as 32 x the scales times the token's 16-code sums)."""
    bld = t.b
    byte = lambda v: ir.Constant(V(I8, 32), [v] * 32)  # noqa: E731
    d = bld.fmul(dy, t.half(p, 208))
    scales = load_vec(bld, p, t.i64(192), V(I8, 16))
    sc16 = bld.sext(scales, V(I16, 16))
    q8sclsub = bld.shl(bld.call(t.pmaddwd, [t.sums(b), sc16]), ir.Constant(V(I32, 8), [5] * 8))
    sumi = ir.Constant(V(I32, 8), [0] * 8)
    for j in range(2):  # 128 values a pass
        q4bits1, q4bits2 = (load_vec(bld, p, t.i64(64 * j + 32 * i), V(I8, 32)) for i in range(2))
        qh = load_vec(bld, p, t.i64(128 + 32 * j), V(I8, 32))
        q4h = (_shift16(bld, bld.and_(qh, byte(3)), 4), _shift16(bld, bld.and_(qh, byte(12)), 2),
               bld.and_(qh, byte(48)), _shift16(bld, bld.and_(qh, byte(-64)), -2))
        q4 = (bld.or_(bld.and_(q4bits1, byte(15)), q4h[0]), bld.or_(bld.and_(q4bits2, byte(15)), q4h[1]),
              bld.or_(bld.and_(_shift16(bld, q4bits1, -4), byte(15)), q4h[2]),
              bld.or_(bld.and_(_shift16(bld, q4bits2, -4), byte(15)), q4h[3]))
        p16 = []
        for i in range(4):
            k = 4 * j + i  # get_scale_shuffle(k): scale 2k in the first 8 lanes, 2k + 1 in the last 8
            sc = bld.call(t.pshufb128, [scales, ir.Constant(V(I8, 16), [2 * k] * 8 + [2 * k + 1] * 8)])
            p16.append(t.scaled(bld.sext(sc, V(I16, 16)), q4[i], t.codes(b, 128 * j + 32 * i)))
        sumi = bld.add(sumi, bld.add(p16[0], p16[1]))
        sumi = bld.add(sumi, bld.add(p16[2], p16[3]))
    return d, bld.sub(sumi, q8sclsub), None


def _q5_k_block(t: _Tools, p, b, dy):
    """Codegen: (d, <8 x i32> sums, ('scalar', dmin, i32 mins x code sums)) of Q5_K super-block b at p (ggml's AVX2
    loop: Q4_K's, each value's fifth bit from qh, the mins' sum added in scalar floats)."""
    bld = t.b
    d, dmin, scale, prod = _k4_header(t, p, b, dy)
    e = lambda i: bld.extract_element(prod, ir.Constant(I32, i))  # noqa: E731
    mins = bld.add(bld.add(e(0), e(1)), bld.add(e(2), e(3)))  # two _mm_hadd_epi32
    low = ir.Constant(V(I8, 32), [0x0F] * 32)
    hbits = load_vec(bld, p, t.i64(16), V(I8, 32))
    sumi = ir.Constant(V(I32, 8), [0] * 8)
    for j in range(4):
        q5 = load_vec(bld, p, t.i64(48 + 32 * j), V(I8, 32))
        p16 = []
        for h, vals in enumerate((bld.and_(q5, low), bld.and_(shift_bytes(bld, q5, 4), low))):
            bit = 2 * j + h  # the fifth bit of every value of sub-block 2j + h, at bit `bit` of hbits' bytes
            hb = bld.and_(hbits, ir.Constant(V(I8, 32), [1 << bit] * 32))
            # ggml's shifts right by `bit`, left by 4 and add; left to itself LLVM merges the shifts and makes the add
            # of disjoint bits an `or` folded with the mask into a `vpternlogq` (_freeze does not stop it, _opaque does)
            q5v = bld.add(vals, _opaque(bld, _shift16(bld, _opaque(bld, _shift16(bld, hb, -bit)) if bit else hb, 4)))
            p16.append(t.scaled(scale(2 * j + h), q5v, t.codes(b, 64 * j + 32 * h)))
        sumi = bld.add(sumi, bld.add(p16[0], p16[1]))
    return d, sumi, ("scalar", dmin, mins)


def _iq4_xs_block(t: _Tools, p, b, dy):
    """Codegen: (d, <8 x i32> sums, None) of IQ4_XS super-block b at p (ggml's AVX2 loop: each nibble looked up in
    the IQ4_NL codebook by `vpshufb`, the int8 products by `vpsignb` / `vpmaddubsw`, each 32 values times its 6-bit
    scale less 32, even and odd sub-blocks in two sums)."""
    bld = t.b
    d = bld.fmul(t.half(p, 0), dy)
    sh = bld.zext(load_vec(bld, p, t.i64(2), I16), I32)
    book = ir.Constant(V(I8, 16), [int(v) for v in KVALUES])
    m4 = ir.Constant(V(I8, 16), [0x0F] * 16)
    sums = [ir.Constant(V(I32, 8), [0] * 8)] * 2
    i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    for ib in range(0, 8, 2):
        sl = bld.zext(bld.load(bld.gep(p, [t.i64(4 + ib // 2)])), I32)
        shb = bld.lshr(sh, i32(2 * ib))  # sh >>= 4 a pass
        ls = (bld.sub(bld.or_(bld.and_(sl, i32(0xF)), bld.and_(bld.shl(shb, i32(4)), i32(0x30))), i32(32)),
              bld.sub(bld.or_(bld.lshr(sl, i32(4)), bld.and_(bld.shl(shb, i32(2)), i32(0x30))), i32(32)))
        for h in range(2):
            q4 = load_vec(bld, p, t.i64(8 + 16 * (ib + h)), V(I8, 16))
            lo = bld.call(t.pshufb128, [book, bld.and_(q4, m4)])
            hi = bld.call(t.pshufb128, [book, bld.and_(_shift16_128(bld, q4, -4), m4)])
            w = bld.shuffle_vector(lo, hi, v32(range(32)))  # MM256_SET_M128I(hi, lo)
            x = t.codes(b, 32 * (ib + h))
            p16 = bld.call(t.maddubs, [bld.call(t.psign, [w, w]), bld.call(t.psign, [x, w])])  # mul_add_epi8
            scale = _splat(bld, bld.trunc(ls[h], I16), 16)
            sums[h] = bld.add(_freeze(bld, bld.call(t.pmaddwd, [p16, scale])), sums[h])
    return d, bld.add(sums[0], sums[1]), None


def _shift16_128(bld, v, bits):
    """_mm_srli_epi16 (bits < 0) of a <16 x i8>."""
    w = bld.bitcast(v, V(I16, 8))
    return bld.bitcast(bld.lshr(w, ir.Constant(V(I16, 8), [-bits] * 8)), V(I8, 16))


def _q2_k_block(t: _Tools, p, b, dy):
    """Codegen: (d, <8 x i32> sums, ('acc', dmin, <8 x i32> mins x code sums)) of Q2_K super-block b at p (ggml's AVX2
    loop: sixteen 4-bit scales and mins a byte, the 2-bit values four to a byte across 32-byte passes, each 16 values
    times its scale (`vpshufb` of the scales widened)."""
    bld = t.b
    d, dmin = bld.fmul(dy, t.half(p, 80)), bld.fmul(bld.fneg(dy), t.half(p, 82))
    ms = load_vec(bld, p, t.i64(0), V(I8, 16))
    m4 = ir.Constant(V(I8, 16), [0x0F] * 16)
    scales8, mins8 = bld.and_(ms, m4), bld.and_(_shift16_128(bld, ms, -4), m4)
    prod = bld.call(t.pmaddwd, [bld.sext(mins8, V(I16, 16)), t.sums(b)])
    return d, _two_bit_passes(t, p, b, bld.sext(scales8, V(I16, 16)), 16, None), ("acc", dmin, prod)


def _two_bit_passes(t: _Tools, p, b, all_scales, qs_at: int, hbits):
    """Codegen: Q2_K's and Q3_K's two passes of 128 values: 32 bytes of 2-bit values at qs_at (+ 32 a pass), value i of
    byte c at bits 2i, against the token's codes 128 j + 32 i; Q3_K's values less 4 where their bit 4 j + i of hbits
    is clear (a second `vpmaddubsw`, subtracted); each 16 values times its scale of all_scales (<16 x i16>)."""
    bld = t.b
    byte = lambda v: ir.Constant(V(I8, 32), [v] * 32)  # noqa: E731
    sumi = ir.Constant(V(I32, 8), [0] * 8)
    for j in range(2):
        half = bld.shuffle_vector(all_scales, all_scales, v32(list(range(8 * j, 8 * j + 8)) * 2))  # MM256_SET_M128I
        sc = bld.bitcast(half, V(I8, 32))
        qbits = load_vec(bld, p, t.i64(qs_at + 32 * j), V(I8, 32))
        p32 = []
        for i in range(4):
            vals = bld.and_(shift_bytes(bld, qbits, 2 * i), byte(3))
            codes = t.codes(b, 128 * j + 32 * i)
            p16 = bld.call(t.maddubs, [vals, codes])
            if hbits is not None:  # q3h: 4 where the high bit is clear (andnot, shift down, shift up by 2)
                bit = 4 * j + i
                q3h = bld.and_(bld.xor(hbits, byte(-1)), byte(1 << bit))
                q3h = _shift16(bld, _opaque(bld, _shift16(bld, q3h, -bit)) if bit else q3h, 2)
                p16 = bld.sub(p16, bld.call(t.maddubs, [q3h, codes]))
            # get_scale_shuffle_q3k(i): scale 2i of the half in the low 128 bits, 2i + 1 in the high
            shuf = ir.Constant(V(I8, 32), [4 * i, 4 * i + 1] * 8 + [4 * i + 2, 4 * i + 3] * 8)
            scale = bld.bitcast(bld.call(t.pshufb, [sc, shuf]), V(I16, 16))
            p32.append(_freeze(bld, bld.call(t.pmaddwd, [scale, p16])))
        sumi = bld.add(sumi, bld.add(bld.add(p32[0], p32[1]), bld.add(p32[2], p32[3])))
    return sumi


def _q3_k_block(t: _Tools, p, b, dy):
    """Codegen: (d, <8 x i32> sums, None) of Q3_K super-block b at p (ggml's AVX2 loop: the 12 bytes of 6-bit scales
    unpacked to sixteen int8s less 32, each value's 2 low bits and its high bit from hmask; Q2_K's passes)."""
    bld = t.b
    d = bld.fmul(dy, t.half(p, 108))
    aux = [bld.load(bld.bitcast(bld.gep(p, [t.i64(96 + 4 * k)]), I32.as_pointer()), align=1) for k in range(3)]
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    km1, km2 = c(0x03030303), c(0x0F0F0F0F)

    def lane(lo, sh_lo, sh_hi):  # ((lo >> sh_lo) & kmask2) | (((aux[2] >> sh_hi) & kmask1) << 4)
        low = bld.and_(bld.lshr(lo, c(sh_lo)) if sh_lo else lo, km2)
        high = bld.and_(bld.lshr(aux[2], c(sh_hi)) if sh_hi else aux[2], km1)
        return bld.or_(low, bld.shl(high, c(4)))
    v = ir.Constant(V(I32, 4), ir.Undefined)
    for k, args in enumerate(((aux[0], 0, 0), (aux[1], 0, 2), (aux[0], 4, 4), (aux[1], 4, 6))):
        v = bld.insert_element(v, lane(*args), c(k))
    sc8 = bld.sub(bld.bitcast(v, V(I8, 16)), ir.Constant(V(I8, 16), [32] * 16))
    hbits = load_vec(bld, p, t.i64(0), V(I8, 32))
    return d, _two_bit_passes(t, p, b, bld.sext(sc8, V(I16, 16)), 32, hbits), None


def _vec_dot_k_codegen(context, builder, sig, args, block_bytes: int, block):
    """Codegen: res[ro] = the row of nb super-blocks of block_bytes at byte woff of w . the Q8_K token (x8 codes, dx
    scales, bs int16 16-code sums, as block_q8_K holds them): per super-block `block` -> (d, integer sums, mins or
    None), d times the sums fused-added into 8 lanes, -dmin times the mins' into 4; ggml's sums at the end."""
    wa, woff, xa, da, ba, nb, ra, roff = args
    data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
    wd, xd, dd, bd, rd = data(0, wa), data(2, xa), data(3, da), data(4, ba), data(6, ra)
    t = _Tools(builder, xd, bd)
    fma8 = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
    fma4 = _fn(builder, "llvm.fma.v4f32", V(F32, 4), [V(F32, 4)] * 3)
    fma1 = _fn(builder, "llvm.fma.f32", F32, [F32] * 3)
    acc = cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8))
    acc_m = cgutils.alloca_once_value(builder, ir.Constant(V(F32, 4), [0.0] * 4))
    summs = cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0))
    mins_kind = None
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        p = builder.gep(wd, [builder.add(woff, builder.mul(b, t.i64(block_bytes)))])
        d, sumi, mins = block(t, p, b, builder.load(builder.gep(dd, [b])))
        if mins is not None:
            mins_kind, dmin, prod = mins
            if mins_kind == "acc":  # Q2_K: into the 8 lanes, fused, before d's
                builder.store(builder.call(fma8, [_splat(builder, dmin, 8), builder.sitofp(prod, V(F32, 8)),
                                                  builder.load(acc)]), acc)
            elif mins_kind == "lanes":  # Q4_K: 4 lanes, fused
                builder.store(builder.call(fma4, [_splat(builder, dmin, 4), builder.sitofp(prod, V(F32, 4)),
                                                  builder.load(acc_m)]), acc_m)
            else:  # Q5_K: summs += dmin * (float)sum, which GCC contracts into one fused multiply-add
                builder.store(builder.call(fma1, [dmin, builder.sitofp(prod, F32), builder.load(summs)]), summs)
        builder.store(builder.call(fma8, [_splat(builder, d, 8), builder.sitofp(sumi, V(F32, 8)), builder.load(acc)]),
                      acc)
    a = builder.load(acc)
    h = builder.fadd(builder.shuffle_vector(a, a, v32(range(4, 8))), builder.shuffle_vector(a, a, v32(range(4))))
    e = lambda v, i: builder.extract_element(v, ir.Constant(I32, i))  # noqa: E731
    s = builder.fadd(builder.fadd(e(h, 0), e(h, 2)), builder.fadd(e(h, 1), e(h, 3)))  # hsum_float_8
    if mins_kind == "lanes":  # Q4_K's 4 lanes of mins: (m0 + m2) + (m1 + m3)
        m = builder.load(acc_m)
        s = builder.fadd(s, builder.fadd(builder.fadd(e(m, 0), e(m, 2)), builder.fadd(e(m, 1), e(m, 3))))
    elif mins_kind == "scalar":
        s = builder.fadd(s, builder.load(summs))
    builder.store(s, builder.gep(rd, [roff]))
    return context.get_dummy_value()


# vec_dot_q4_k / _q6_k / _q5_k / _iq4_xs / _q2_k / _q3_k(w, wo, x8, dx, bs, nb, res, ro): res[ro] = the row at byte
# wo of w (nb super-blocks) . the Q8_K token (x8 int8 codes, dx float32 scales, bs int16 16-code sums), as ggml's
# AVX2 ggml_vec_dot_<type>_q8_K
if HAVE_AVX2:
    vec_dot_q4_k = q8_k_intrinsic(partial(_vec_dot_k_codegen, block_bytes=Q4_K_BYTES, block=_q4_k_block),
                                  "vec_dot_q4_k")
    vec_dot_q6_k = q8_k_intrinsic(partial(_vec_dot_k_codegen, block_bytes=Q6_K_BYTES, block=_q6_k_block),
                                  "vec_dot_q6_k")
    vec_dot_q5_k = q8_k_intrinsic(partial(_vec_dot_k_codegen, block_bytes=Q5_K_BYTES, block=_q5_k_block),
                                  "vec_dot_q5_k")
    vec_dot_iq4_xs = q8_k_intrinsic(partial(_vec_dot_k_codegen, block_bytes=IQ4_XS_BYTES, block=_iq4_xs_block),
                                    "vec_dot_iq4_xs")
    vec_dot_q2_k = q8_k_intrinsic(partial(_vec_dot_k_codegen, block_bytes=Q2_K_BYTES, block=_q2_k_block),
                                  "vec_dot_q2_k")
    vec_dot_q3_k = q8_k_intrinsic(partial(_vec_dot_k_codegen, block_bytes=Q3_K_BYTES, block=_q3_k_block),
                                  "vec_dot_q3_k")
