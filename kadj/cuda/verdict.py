"""kadj's verdict on a CUDA kernel, as data: accepted with its adjoint sources, or
refused with the message.

Under ``NUMBA_ENABLE_CUDASIM=1`` kernels are typed through the simulator shim
(:mod:`kadj.cuda.shim`), otherwise through numba-cuda's typing context; both must give
the same verdict and, where accepted, the same adjoint.  :func:`verdict` describes one
kernel for one set of example arguments in the current process; comparing its result
from a process with the simulator and one without checks that promise
(``tests/test_cuda_verdict.py``)::

    from kadj.cuda.verdict import verdict
    verdict(heat_step, (np.zeros(8), np.zeros(8), 0.1))
    # {'typing': 'numba-cuda', 'verdict': 'accepted', 'message': '',
    #  'sources': {'scatter': 'def heat_step_adjoint(...', 'gather': ..., 'zero': ...},
    #  'types': {'alpha': 'float64', ...}}
"""
from __future__ import annotations

import re

from numba.core import types

from ..errors import DifferentiationError
from .frontend import simulator_enabled, type_kernel

# callees and modules: their numba types name the typing path's own objects
_OPAQUE = (types.Module, types.Function, types.Dispatcher, types.NumberClass, types.DType)
# variables of inlined helpers: numba numbers them with a counter of the whole process
_INLINED = re.compile(r"_v(\d+)_")


def typing_path():
    """"simulator shim" or "numba-cuda": how this process types CUDA kernels."""
    return "simulator shim" if simulator_enabled() else "numba-cuda"


def value_types(tk):
    """{variable: numba type name} of a typed kernel's values (numbers, arrays,
    tuples...), leaving out callees and modules."""
    counters = sorted({int(m) for name in tk.typemap for m in _INLINED.findall(name)})
    order = {str(c): k for k, c in enumerate(counters)}
    out = {}
    for name, t in tk.typemap.items():
        if not isinstance(t, _OPAQUE):
            name = _INLINED.sub(lambda m: f"_v#{order[m.group(1)]}_", name)
            out[name] = str(types.unliteral(t))
    return dict(sorted(out.items()))


def verdict(k, args):
    """JSON-ready description of kadj's verdict on CUDA kernel ``k`` (a
    ``kadj.differentiate``-d ``@cuda.jit`` kernel) for example arguments ``args``:
    ``typing`` (:func:`typing_path`), ``verdict`` ("accepted" or "refused"),
    ``message`` (the refusal, "" when accepted), ``sources`` (adjoint source per form:
    "scatter", and "gather" and "zero" when the kernel has a gather form), ``gather``
    (why there is no gather form, "" when there is) and ``types``
    (:func:`value_types` of the typed kernel; {} when typing itself failed)."""
    out = {"typing": typing_path(), "verdict": "accepted", "message": "",
           "sources": {}, "gather": "", "types": {}}
    try:
        comp = k.compiled(*args)
    except Exception as exc:
        if isinstance(exc, DifferentiationError):
            out["verdict"], out["message"] = "refused", str(exc)
        else:  # numba could not type it, or kadj failed: the kind and the first line
            first = (str(exc).strip().splitlines() or [""])[0]
            out["verdict"], out["message"] = "error", f"{type(exc).__name__}: {first}"
        try:
            out["types"] = value_types(type_kernel(k.py_func, k._arg_types(args)))
        except Exception:  # typing is what failed
            pass
        return out
    out["types"] = value_types(comp.typed)
    out["sources"]["scatter"] = comp.source
    if comp.gather is not None:
        out["sources"]["gather"], out["sources"]["zero"] = comp.gather.sources
    else:
        out["gather"] = str(comp.report.get("gather", {}).get("why", ""))
    return out
