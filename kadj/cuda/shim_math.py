"""numba-cuda's typing of ``math`` functions, for the simulator shim
(:mod:`kadj.cuda.shim`).

numba-cuda declares them in ``numba/cuda/cudamath.py`` (which cannot be imported under
the simulator), and some differ from the CPU's: ``math.floor``/``ceil``/``trunc`` of a
float are floats, ``math.pow(float32, int32)`` is a float32.  The same cases here give the
shim the typed IR numba-cuda gives.
"""
from __future__ import annotations

import math

from numba.core import types
from numba.core.typing.templates import ConcreteTemplate, signature


def math_declarations():
    """{math function: numba function type} as numba-cuda declares them (e.g.
    ``math.floor`` of a float64 is a float64 there, an int64 on the CPU)."""
    f16, f32, f64 = types.float16, types.float32, types.float64
    i32, i64, u64 = types.int32, types.int64, types.uint64
    unary = [signature(f64, i64), signature(f64, u64), signature(f32, f32),
             signature(f64, f64)]
    pair = [signature(f64, i64, i64), signature(f64, u64, u64), signature(f32, f32, f32),
            signature(f64, f64, f64)]
    binary = [signature(f32, f32, f32), signature(f64, f64, f64)]
    groups = [
        (("acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "degrees", "erf",
          "erfc", "expm1", "gamma", "lgamma", "log1p", "radians", "sinh", "tanh", "tan"),
         unary),
        (("sin", "cos", "ceil", "floor", "sqrt", "log", "log2", "log10", "exp", "fabs",
          "trunc", "exp2"), unary + [signature(f16, f16)]),
        (("atan2", "hypot"), pair),
        (("copysign", "fmod", "nextafter", "remainder"), binary),
        (("pow",), binary + [signature(f32, f32, i32), signature(f64, f64, i32)]),
        (("frexp",), [signature(types.Tuple([f32, i32]), f32),
                      signature(types.Tuple([f64, i32]), f64)]),
        (("ldexp",), [signature(f32, f32, i32), signature(f64, f64, i32)]),
        (("isinf", "isnan", "isfinite"), [signature(types.boolean, t)
                                          for t in (i64, u64, f32, f64)]),
        (("modf",), [signature(types.UniTuple(f64, 2), f64),
                     signature(types.UniTuple(f32, 2), f32)]),
    ]
    out = {}
    for names, cases in groups:
        for name in names:
            fn = getattr(math, name, None)
            if fn is not None:
                out[fn] = types.Function(type(f"_Math_{name}", (ConcreteTemplate,),
                                              {"key": fn, "cases": cases}))
    return out
