"""Helpers of the size-swept gradient tests (tests/test_size_sweep*.py).

A CPU adjoint records values on growable tapes (``_tape_f64``, ``_tape_i64``: 1024
entries at first, reserved ahead of loops, doubled when short), so mistakes in the
reservations show only at sizes whose pushes reach a capacity at the wrong moment.
These helpers

- re-jit a kernel with ``boundscheck=True`` (kadj compiles the adjoint with the
  kernel's own options, so a tape overrun raises ``IndexError`` instead of silently
  corrupting memory);
- count a kernel's pushes per tape (its adjoint source run as plain Python, with a
  high-water mark after every push), fit them as ``a + b * n`` over a few sizes and
  pick the sizes whose pushes land on and around 1024, 2048, 4096, ...;
- audit the tapes (:func:`check_tapes`): the adjoint source run as Python with tapes
  that start empty and grow to exactly what each reservation asks, so a push the
  reservation plan did not cover fails at any size, and every tape pointer must be
  back at 0 at return (a push without a pop fails even where the tape never fills);
- run :func:`kadj.testing.check_grad`'s inner-product test (one random direction per
  argument: central differences in float64 against ``<adjoint(ct), d>``) at many
  sizes, one compilation per kernel, and report every failing size at once.
"""
from __future__ import annotations

import math
import re

import numba
import numpy as np

from kadj import call_memory
from kadj.testing import check_grad

TAPE_START = 1024                      # entries of a fresh tape (GROWABLE_START in kadj/lowering.py)
CAPACITIES = tuple(TAPE_START << k for k in range(6))       # 1024 ... 32768
MAX_PUSHES = 2 * CAPACITIES[-1]        # generic sizes stop here (tapes grow 6 times)
# odd sizes, primes, powers of two and their neighbours, large ones
GENERIC_SIZES = (1, 2, 3, 5, 7, 13, 31, 64, 97, 127, 128, 129, 257, 509, 1021, 1024,
                 1025, 2039, 4093, 8191, 16411, 40009)


def bounds_checked(dispatcher):
    """``dispatcher``'s Python function jitted again with ``boundscheck=True`` (its
    other options kept)."""
    opts = {k: v for k, v in dispatcher.targetoptions.items()
            if k not in ("nopython", "boundscheck")}
    return numba.njit(boundscheck=True, **opts)(dispatcher.py_func)


def rng_for(name, *size):
    """A generator seeded by a test's name and size (the same draw on every run)."""
    return np.random.default_rng([sum(map(ord, name)), *map(int, size)])


# ------------------------------------------------------------------ push counts

_PUSH = re.compile(r"^(?P<pad>\s*)(?P<sp>_sp_(?P<kind>\w+)) \+= 1$", re.M)
# a growable tape's first allocation (kadj.kept_memory), its size set to 0 in strict runs
_TAPE_DECL = re.compile(r"^(?P<head>\s*_tape_\w+ = _kept_array\(_keep_bytes, )"
                        r"max\(\d+, _keep_need\[\d+\] // \d+\)(?P<tail>, )", re.M)
_SP_DECL = re.compile(r"^\s*(_sp_\w+) = 0$", re.M)
_RETURN = re.compile(r"^(?P<pad>\s*)return\b", re.M)


class TapeError(AssertionError):
    """An adjoint whose tapes are wrong: a push past the reserved capacity, or a tape
    pointer not back at 0 when the adjoint returns (a push without its pop)."""


def _exact_reserve(tape, need):
    """``_reserve`` without slack: the tape grows to exactly ``need`` entries, so any
    push the reservation plan did not count runs past the end."""
    if need <= tape.shape[0]:
        return tape
    bigger = np.empty(need, tape.dtype)
    bigger[: tape.shape[0]] = tape
    return bigger


def run_source(kernel, args, strict=False):
    """Run one adjoint call of the differentiated ``kernel`` at ``args`` from its
    adjoint source, as plain Python.  Returns ({tape: highest number of entries held
    at once}, {tape pointer: value at return}), or None when the source cannot run
    outside numba.  ``strict``: the tapes start empty and grow to exactly what each
    reservation or capacity check asks, so a push the plan left uncovered raises
    :class:`TapeError` (so does a tape index out of range in any mode)."""
    from kadj import runtime_helpers

    source = kernel.adjoint_source(*args)
    pointers = _SP_DECL.findall(source)
    ends = ", ".join(["'': 0"] + [f"'{sp}': {sp}" for sp in pointers])
    text = _PUSH.sub(lambda m: f"{m.group(0)}\n{m.group('pad')}_HW['{m.group('kind')}']"
                     f" = max(_HW.get('{m.group('kind')}', 0), {m.group('sp')})", source)
    # (the adjoint's own returns: a row function before it returns its sums)
    last = [m.start() for m in re.finditer(r"^def \w+\(", text, re.M)][-1]
    text = text[:last] + _RETURN.sub(
        lambda m: f"{m.group('pad')}_END.update({{{ends}}})\n{m.group(0)}", text[last:])
    if strict:
        text = _TAPE_DECL.sub(lambda m: f"{m.group('head')}0{m.group('tail')}", text)
    marks, end = {}, {}
    ns = {"np": np, "math": math, "_HW": marks, "_END": end}
    ns.update({k: getattr(runtime_helpers, k) for k in ("_push", "_sign", "_reserve",
                                                        "_trips")})
    if strict:       # (after the source's own import of the helpers)
        ns["_exact_reserve"] = _exact_reserve
        text = re.sub(r"^(from kadj\.runtime_helpers import .*)$",
                      r"\1\n_reserve = _exact_reserve", text, flags=re.M)
    plan = kernel.adjoint_plan(*args)
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    adjoints = [np.zeros_like(fwd[i]) if isinstance(fwd[i], np.ndarray)
                else np.zeros(1, np.asarray(fwd[i]).dtype) for i in plan.adjoint_args]
    extra = (1.0,) if plan.returns_value else ()
    name = f"<adjoint source of {plan.kernel_name}>"
    lines = text.splitlines()
    try:
        exec(compile(text, name, "exec"), ns)
        # (the adjoint is the source's last function: a parallel loop's body may come
        # first as a function of its own, kadj.row_outline)
        fn = ns[re.findall(r"^def (\w+)\(", text, re.M)[-1]]
        # every tape new memory (kadj.call_memory.fresh): of exactly its reserved size
        fn(*fwd, *adjoints, *extra, *call_memory.fresh_for(fn))
    except IndexError as exc:
        tb = exc.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        line = lines[tb.tb_lineno - 1] if tb.tb_frame.f_code.co_filename == name else ""
        if "_tape_" in line:
            raise TapeError(f"{plan.kernel_name}: a tape index out of range (a push "
                            f"past the reserved capacity, or a pop of nothing pushed): "
                            f"{line.strip()}") from exc
        return None
    except Exception:          # numba-only constructs: the caller falls back
        return None
    return marks, end     # (``end`` has an entry '' once the adjoint returned)


def push_counts(kernel, args):
    """{tape: highest number of entries held at once} of one adjoint call of the
    differentiated ``kernel`` at ``args``, from its adjoint source run as plain Python
    (None when the source cannot run outside numba)."""
    ran = run_source(kernel, args)
    return None if ran is None else ran[0]


def check_tapes(kernel, args):
    """Run the adjoint source at ``args`` as Python with strict tapes
    (:func:`run_source`) and raise :class:`TapeError` unless every push was covered
    by a reservation or a capacity check and every tape is back at 0 at return.
    Returns False when the source cannot run outside numba, else True."""
    ran = run_source(kernel, args, strict=True)
    if ran is None:
        return False
    _marks, end = ran
    name = kernel.adjoint_plan(*args).kernel_name
    if not end:
        raise TapeError(f"{name}: the adjoint source returned without its final return")
    left = {sp: n for sp, n in end.items() if sp and n != 0}
    if left:
        raise TapeError(f"{name}: tape pointers not back at 0 when the adjoint returns "
                        f"({left}): pushes without pops")
    return True


def linear_push_model(kernel, sized, probes=(40, 81, 123)):
    """{tape: (a, b)} with pushes(n) == a + b * n at every probe size, for the tapes
    that grow with n; None when the counts cannot be had or are not linear in n."""
    counts = []
    for n in probes:
        c = push_counts(kernel, sized(rng_for("probe", n), n))
        if c is None:
            return None
        counts.append(c)
    model = {}
    for kind in set().union(*counts):
        p = [c.get(kind, 0) for c in counts]
        b = (p[1] - p[0]) / (probes[1] - probes[0])
        a = p[0] - b * probes[0]
        if any(abs(a + b * n - q) > 1e-9 for n, q in zip(probes, p)):
            return None
        if b > 0:
            model[kind] = (a, b)
    return model


def capacity_sizes(model, capacities=CAPACITIES, spread=1):
    """Sizes whose pushes land on each capacity and just around it (``spread`` sizes
    either side of the crossing)."""
    sizes = set()
    for a, b in model.values():
        for cap in capacities:
            n0 = (cap - a) / b
            for n in range(math.floor(n0) - spread, math.ceil(n0) + spread + 1):
                if n >= 1:
                    sizes.add(n)
    return sizes


def landing_shapes(kernel, shaped, inners, capacities=CAPACITIES[:4]):
    """(outer, inner) shapes of a two-level kernel ``shaped(rng, outer, inner)`` where
    an outer trip ends with the tape at a capacity (exactly, when the pushes per trip
    divide the room) and one or two trips follow, for each inner size whose pushes are
    linear in the outer size."""
    shapes = set()
    for inner in inners:
        model = linear_push_model(kernel, lambda rng, n: shaped(rng, n, inner))
        for a, b in (model or {}).values():
            for cap in capacities:
                trips = math.floor((cap - a) / b)
                if trips >= 0:
                    shapes |= {(trips + 1, inner), (trips + 2, inner)}
    return shapes


def sizes_for(kernel, sized, generic=GENERIC_SIZES, max_size=None):
    """The generic sizes plus, when the kernel's pushes are linear in n, the sizes
    around tape capacities; each at most ``max_size``, and generic sizes beyond
    ``MAX_PUSHES`` pushes left out.  Also returns the push model."""
    model = linear_push_model(kernel, sized)
    sizes = set(generic)
    if model:
        sizes = {n for n in sizes
                 if all(a + b * n <= MAX_PUSHES for a, b in model.values())}
        sizes |= capacity_sizes(model)
    if max_size is not None:
        sizes = {n for n in sizes if n <= max_size}
    return sorted(sizes), model


# ------------------------------------------------------------------ the checks

def check_many(kernel, cases, wrt=None, **tolerances):
    """Run the inner-product test of ``check_grad`` on every ``(label, args)`` of
    ``cases``; raise one AssertionError naming every failing case (and its first line
    of error), else return the number of cases checked.  Empty arrays are left out of
    ``wrt`` (they have no gradient to check)."""
    failures = []
    count = 0
    for label, args in cases:
        count += 1
        try:
            check_grad(kernel, args, wrt=_non_empty(kernel, args, wrt),
                       full_jacobian_max=0, seed=count, **tolerances)
        except Exception as exc:   # noqa: BLE001 - every failure is reported below
            failures.append((label, f"{type(exc).__name__}: {_first_line(exc)}"))
    if failures:
        shown = "\n".join(f"  {label}: {msg}" for label, msg in failures[:12])
        more = f"\n  ... and {len(failures) - 12} more" if len(failures) > 12 else ""
        labels = ", ".join(str(label) for label, _ in failures)
        raise AssertionError(
            f"kernel '{getattr(kernel, '__name__', kernel)}' fails the gradient check at "
            f"{len(failures)} of {count} sizes ({labels}):\n{shown}{more}")
    return count


#: what check_grad says when finite differences straddle a jump of the function (a
#: trip count or a test's outcome that changed within the step), not a wrong adjoint
TIE = ("looks non-differentiable", "agrees with finite differences")


def check_redrawing_ties(kernel, label, data, note, attempts=3):
    """:func:`check_many` of ``kernel`` at ``data(0)``; where check_grad names a kink or
    tie (or finds every element's gradient right), again at ``data(1)``, ...: continuous
    data put a jump within the finite-difference step only rarely, and a wrong adjoint
    fails on any data.  ``note`` (Hypothesis') records each redraw."""
    for attempt in range(attempts):
        try:
            check_many(kernel, [(label, data(attempt))])
            return
        except AssertionError as exc:
            if attempt == attempts - 1 or not any(t in str(exc) for t in TIE):
                raise
            note(f"{label}: data redrawn after a tie: {str(exc)[:200]}")


def _non_empty(kernel, args, wrt):
    """``wrt`` without the arguments that are empty arrays (``wrt`` itself when none
    is)."""
    empty = {i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.size == 0}
    if not empty:
        return wrt
    plan = kernel.adjoint_plan(*args)
    names = wrt if wrt is not None else [plan.arg_names[i] for i in plan.adjoint_args]
    return tuple(n for n in names if plan.arg_names.index(n) not in empty)


def _first_line(exc):
    text = str(exc).strip()
    for line in text.splitlines():
        if line.startswith("The adjoint") or "index" in line.lower():
            return line.strip()[:400]
    return (text.splitlines() or [""])[0][:400]
