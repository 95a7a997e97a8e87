"""Each weight type's row products (row_products.rows_matmul at that type code) compiled once, as a C function of
its own, and called by the parallel drivers through one table of their addresses.

Why: numba links a callee's whole compiled module into each caller and optimises and generates code for all of it
again (numba 0.68, CPUCodeLibrary.finalize). With the ten types' kernels behind every driver (kernels._parts,
cpu_experts._moe, their serial twins, cpu_layers.run_layers, attention_step ...) and each level between them, most of
a cold `execute`'s compiling went on those same kernels. A call through the table links nothing: each type's kernels
are generated once, in its own C function (numba's cfunc, cached on disk like the rest), and a driver's module holds
only the indirect call. A cold all-CPU and 4-stream run of `tiny` (empty NUMBA_CACHE_DIR): 129-131 s before, 65-67 s
(its ten C functions ~30 s of that, at import); the same tokens, and the same speed (paired in one process).

The table is a process-wide symbol (llvmlite's add_symbol), so the drivers' cached machine code finds it in every
process; its entries are filled at import, before any driver is loaded. Arrays cross the call as a data pointer and
their shape: every array passed must be C-contiguous (a typing error otherwise).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import llvmlite.binding as ll
import numpy as np
from llvmlite import ir
from numba import carray, cfunc, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from .gemm import IQ4_XS
from .nbcache import drop_stale_cache
from .row_products import rows_matmul

drop_stale_cache(__file__)

_P = types.CPointer
_I = types.int64
# row_products.rows_matmul(code, w, r0, r1, rb, X, X16, DX, P, res, off) with each array as its data pointer and shape
_SIG = types.void(_P(types.uint8), _I, _I, _I, _I, _P(types.float32), _I, _I, _P(types.int16), _I, _I,
                  _P(types.float32), _I, _I, _P(types.float32), _I, _I, _I, _P(types.float32), _I, _I, _I)


def _typed(code: int):
    """rows_matmul for type `code` as a C function (one numba cache entry per code: the closure's value is in its key)."""
    @cfunc(_SIG, fastmath=True, cache=True)
    def rows(wp, wn, r0, r1, rb, xp, xm, xc, x16p, x16m, x16c, dxp, dxm, dxc, pp, p0, p1, p2, resp, resm, resc, off):
        rows_matmul(code, carray(wp, (wn,)), r0, r1, rb, carray(xp, (xm, xc)), carray(x16p, (x16m, x16c)),
                    carray(dxp, (dxm, dxc)), carray(pp, (p0, p1, p2)), carray(resp, (resm, resc)), off)
    return rows


@cfunc(_SIG, cache=True)
def _no_kernels(wp, wn, r0, r1, rb, xp, xm, xc, x16p, x16m, x16c, dxp, dxm, dxc, pp, p0, p1, p2, resp, resm, resc, off):
    """A type code with no kernels (none a loaded model has: gguf_model checks its types): NaN results, where a jump
    to address 0 would end the process."""
    res = carray(resp, (resm, resc))
    for k in range(resm):
        for r in range(r1 - r0):
            res[k, off + r] = np.nan


_KERNELS = [_no_kernels] + [_typed(c) for c in range(1, IQ4_XS + 1)]
TABLE = np.array([k.address for k in _KERNELS], np.int64)  # by type code; kept alive: the symbol points here
# one symbol a checkout (its cached drivers are its own: numba keys its cache by source path), so that two copies of
# the executor imported in one process (benchmarks/bench_expert_job.py --root) each call their own kernels
_SYMBOL = "moe_offload_rows_matmul_table_" + hashlib.sha1(str(Path(__file__).resolve()).encode()).hexdigest()[:12]
ll.add_symbol(_SYMBOL, TABLE.ctypes.data)


@intrinsic
def table_rows_matmul(typingctx, code, w, r0, r1, rb, X, X16, DX, P, res, off):
    """row_products.rows_matmul(code, w, r0, r1, rb, X, X16, DX, P, res, off) through the table: the same
    results, with none of the kernels compiled into the caller (a code outside the table: NaN results)."""
    arrays = {"w": (w, 1), "X": (X, 2), "X16": (X16, 2), "DX": (DX, 2), "P": (P, 3), "res": (res, 2)}
    for name, (ty, nd) in arrays.items():
        if not isinstance(ty, types.Array) or ty.ndim != nd or ty.layout != "C":
            raise TypingError(f"table_rows_matmul: {name} must be a C-contiguous {nd}-D array, not {ty}")
    sig = types.void(code, w, r0, r1, rb, X, X16, DX, P, res, off)

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        flat = []
        for ty, val in zip(sig.args[1:], args[1:]):
            if isinstance(ty, types.Array):
                a = cgutils.create_struct_proxy(ty)(context, builder, value=val)
                flat += [a.data, *cgutils.unpack_tuple(builder, a.shape, ty.ndim)]
            else:
                flat.append(context.cast(builder, val, ty, types.int64))
        mod = builder.module
        tab = mod.globals.get(_SYMBOL) or ir.GlobalVariable(mod, ir.ArrayType(i64, len(TABLE)), _SYMBOL)
        idx = context.cast(builder, args[0], sig.args[0], types.int64)
        known = builder.icmp_unsigned("<", idx, ir.Constant(i64, len(TABLE)))  # else entry 0: _no_kernels
        idx = builder.select(known, idx, ir.Constant(i64, 0))
        fn = builder.inttoptr(builder.load(builder.gep(tab, [ir.Constant(i64, 0), idx])),
                              ir.FunctionType(ir.VoidType(), [v.type for v in flat]).as_pointer())
        builder.call(fn, flat)
        return context.get_dummy_value()
    return sig, codegen
