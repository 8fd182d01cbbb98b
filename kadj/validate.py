"""Argument checks for every target: the CPU adjoint call, the CUDA launch and its
adjoint, ``kadj.grad`` (and the tape, which may use the same helpers).

Bad input gets one sentence naming the kernel, the argument and what to do, and loses
nothing: every check runs before the adjoint writes anything, so a refused call leaves
the user's arrays, adjoint buffers included, as they were.  Checks that need only the
arguments (unsupported dtypes, lists, keyword arguments) run before anything is
compiled; the adjoint buffers are checked against the argument layout
(:class:`kadj.plan.AdjointPlan`) just before the adjoint runs.

Memory overlap is tested by :mod:`kadj.arrays` (exact, within one memory space, with a
bounded effort); when the bounded test cannot decide, the call is refused.
"""
from __future__ import annotations

import linecache
import math
import numbers
import re

import numpy as np

from . import arrays
from .errors import DifferentiationError

# the array tests (kadj.arrays), importable from here as well
is_array, overlap, self_overlapping = arrays.is_array, arrays.overlap, \
    arrays.self_overlapping
Undecided, MAX_OVERLAP_WORK = arrays.Undecided, arrays.MAX_OVERLAP_WORK

MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2 ** 31 - 1, 65535, 65535)


# ---- binding positional and keyword arguments --------------------------------------------
def bind(call, names, defaults, args, kwargs):
    """``args`` and ``kwargs`` as one positional tuple for a function with argument
    ``names`` and trailing ``defaults``; omitted trailing arguments take their defaults."""
    n = len(names)
    if len(args) > n:
        raise TypeError(f"{call} takes {n} arguments {names}, got {len(args)}.")
    out = list(args)
    for name in kwargs:
        if name not in names:
            raise TypeError(f"{call} got an unexpected keyword argument '{name}'; its "
                            f"arguments are {names}.")
        if names.index(name) < len(args):
            raise TypeError(f"{call} got two values for argument '{name}' (by position "
                            "and by keyword); pass it once.")
    first_default = n - len(defaults)
    missing = [names[i] for i in range(len(args), first_default) if names[i] not in kwargs]
    if missing:
        raise TypeError(f"{call} is missing argument(s) {tuple(missing)}; it takes "
                        f"{names}.")
    for i in range(len(args), n):
        out.append(kwargs[names[i]] if names[i] in kwargs else
                   defaults[i - first_default])
    return tuple(out)


PREFIX = {"adjoint": "adj_", "tangent": "dot_"}   # keyword prefix of each slot kind
TAKER = {"adjoint": "the adjoint", "tangent": "jvp"}  # the call that takes the slots
BUFFERS = {"adjoint": "adjoint buffers", "tangent": "tangents"}   # the slots, in messages


def split_adjoint_call(call, names, defaults, args, kwargs, slot="adjoint"):
    """``k.adjoint(*args, **kwargs)`` -> (forward arguments, positional adjoints,
    adjoints by name).  Forward arguments come first, positionally (all of them, defaults
    included) or by name; adjoints follow positionally or as ``adj_<name>=``.
    ``slot="tangent"``: the same for ``k.jvp``, whose tangents are ``dot_<name>=``."""
    n, pre = len(names), PREFIX[slot]
    fwd_kw = {k: v for k, v in kwargs.items() if k in names}
    adj_kw = {k: v for k, v in kwargs.items() if k not in names}
    for k in adj_kw:
        if not (k.startswith(pre) and k[4:] in names):
            raise TypeError(
                f"{call} got an unexpected keyword argument '{k}'; it takes the forward "
                f"arguments {names} and then their {slot}s "
                f"({', '.join(pre + m for m in names)}, for those that have one).")
    if len(args) > n and fwd_kw:
        raise TypeError(f"{call} got forward argument(s) {tuple(fwd_kw)} by keyword after "
                        f"{len(args)} positional arguments; pass the forward arguments "
                        f"first, then the {slot}s.")
    if len(args) < n and not kwargs:
        raise TypeError(f"{call} expects all {n} forward arguments {names} (defaults "
                        f"included) followed by their {slot}s, or keyword arguments "
                        f"({slot}s as {pre}<name>=...); got {len(args)} positional "
                        "arguments.")
    fwd = bind(call, names, defaults, args[:n], fwd_kw)
    first_default = n - len(defaults)
    # n positional arguments and no adjoint by name: the adjoints must be among them
    # (an adjoint call has some), so an array where a number is defaulted is one
    suspect = len(args) > n or (len(args) == n and not adj_kw)
    for i in range(first_default, n if suspect else 0):
        d = defaults[i - first_default]
        if is_array(args[i]) and isinstance(d, (int, float)):
            raise _default_got_array(call, names, i, d, "", slot)
    return fwd, tuple(args[n:]), adj_kw


def _default_got_array(call, names, i, default, why, slot):
    return TypeError(
        f"{call}: argument '{names[i]}' (default {default!r}) got an array, probably "
        f"{'an' if slot[0] in 'aeiou' else 'a'} {slot}{why}: {TAKER[slot]} takes every "
        f"forward argument, defaults included, before the {slot}s. Pass '{names[i]}' explicitly "
        f"({default!r} for the default); if it really is an array here, pass the "
        f"{slot}s by keyword ({PREFIX[slot]}<name>=...).")


def refuses_construct(exc):
    """Is ``exc`` kadj refusing a construct of a kernel numba could type?"""
    return isinstance(exc, DifferentiationError) and exc.construct != "typing"


def explain_omitted_default(call, names, defaults, args, kwargs, exc, slot="adjoint"):
    """A clear error for ``exc`` (numba could not type the kernel, or the adjoint count
    did not match) of an adjoint call that filled a defaulted forward argument whose
    default is not an array (``scale=None``) positionally with an array: most likely
    the caller left the default out and the adjoints moved into its place.  None when
    no such argument explains ``exc``.  (A number default given an array is refused up
    front, by :func:`split_adjoint_call`; a ``None`` default may legitimately take an
    array, so it is blamed only when the call fails.)"""
    n = len(names)
    if len(args) <= n and not any(k not in names for k in kwargs):
        return None                     # no adjoints at all
    first = n - len(defaults)
    for i in range(first, min(len(args), n)):
        d = defaults[i - first]
        if is_array(args[i]) and not is_array(d):
            what = (str(exc).rstrip(".") if isinstance(exc, TypeError) else
                    "kadj cannot differentiate the kernel with it" if refuses_construct(exc)
                    else "numba cannot type the kernel with it")
            return _default_got_array(call, names, i, d, f" ({what})", slot)
    return None


def blame_omitted_default(call, names, defaults, args, kwargs, exc, slot="adjoint"):
    """Raise :func:`explain_omitted_default`'s error in place of ``exc`` when a
    defaulted argument that took an array explains it; return otherwise.  A
    :class:`DifferentiationError` for a construct (the kernel with that array is one kadj
    refuses) stays what it is, with the explanation added as a note; a typing failure is
    replaced."""
    clear = explain_omitted_default(call, names, defaults, args, kwargs or {}, exc, slot)
    if clear is None:
        return
    if refuses_construct(exc):
        exc.add_note(str(clear))
        return
    raise clear from exc


def order_adjoints(call, plan, fwd, positional, by_name):
    """The adjoint buffers in slot order, from positional ones and ``adj_<name>=``."""
    expected = plan.adjoint_names()
    if not by_name:
        if len(positional) != len(expected):
            raise TypeError(
                f"{call} expects {len(expected)} adjoint argument(s) {expected} after "
                f"the forward arguments, got {len(positional)}." +
                (_int_hint(plan, fwd) if len(positional) > len(expected) else ""))
        return tuple(positional)
    if len(positional) > len(expected):
        raise TypeError(f"{call} expects {len(expected)} adjoint argument(s) {expected}, "
                        f"got {len(positional)} positional ones and {tuple(by_name)}.")
    out = list(positional)
    for name in by_name:
        if name not in expected:
            raise TypeError(f"{call}: '{name[4:]}' has no adjoint slot (it is not a "
                            "floating-point argument the kernel differentiates, or not in "
                            f"wrt); its adjoints are {expected}.")
        if expected.index(name) < len(positional):
            raise TypeError(f"{call} got {name} by position and by keyword; pass it once.")
    missing = [m for m in expected[len(positional):] if m not in by_name]
    if missing:
        raise TypeError(f"{call} is missing adjoint argument(s) {tuple(missing)}; it "
                        f"expects {expected}.")
    out += [by_name[m] for m in expected[len(positional):]]
    return tuple(out)


def _int_hint(plan, fwd):
    """Why an argument the caller passed an adjoint for may have no slot: an integer."""
    ints = [(n, a) for i, (n, a) in enumerate(zip(plan.arg_names, fwd))
            if i not in plan.adjoint_args and isinstance(a, (int, np.integer))
            and not isinstance(a, (bool, np.bool_))]
    return "".join(f" Argument '{n}' is the integer {a!r}, so it has no adjoint; pass "
                   f"{float(a)!r} to differentiate with respect to it." for n, a in ints)


# ---- the arguments themselves (before anything is compiled) ------------------------------
def check_arguments(call, names, args):
    """Refuse arguments numba cannot pass or kadj cannot differentiate: lists, tuples
    holding arrays, float16, non-native byte order, object arrays."""
    for name, a in zip(names, args):
        if isinstance(a, list):
            raise TypeError(f"{call}: argument '{name}' is a Python list; kernels take "
                            f"arrays: pass np.asarray({name}).")
        if isinstance(a, tuple) and next(arrays.arrays_in(a), None) is not None:
            raise TypeError(f"{call}: argument '{name}' is a tuple holding arrays; kadj "
                            "does not support tuples holding arrays as kernel arguments "
                            "(it cannot give the arrays in them adjoint buffers). Pass "
                            "the arrays as separate arguments of the kernel.")
        if is_array(a) or isinstance(a, np.generic):
            _check_dtype(call, name, np.dtype(a.dtype), is_array(a))


def _check_dtype(call, name, dt, array):
    what = "array" if array else "scalar"
    if dt.kind == "f" and dt.itemsize == 2:
        raise TypeError(f"{call}: argument '{name}' is a float16 {what}, which kadj does "
                        f"not differentiate; convert it with {name}.astype(np.float32) "
                        "(or np.float64).")
    if not dt.isnative:
        raise TypeError(f"{call}: argument '{name}' has non-native byte order ({dt.str}), "
                        "which numba cannot pass to a kernel; convert it with "
                        f"{name}.astype({dt.newbyteorder('=').name!r}).")
    if (dt.kind == "f" and dt.itemsize > 8) or (dt.kind == "c" and dt.itemsize > 16):
        raise TypeError(f"{call}: argument '{name}' has dtype {dt}, which numba does not "
                        f"support; convert it with {name}.astype(np.float64).")
    if dt.kind == "O":
        raise TypeError(f"{call}: argument '{name}' is an object array; pass a numeric "
                        f"array (np.asarray({name}, dtype=np.float64)).")


def unsupported_type(call, name, value):
    """The error for an argument numba types as a Python object."""
    return TypeError(f"{call}: argument '{name}' is a {type(value).__name__}, which numba "
                     f"cannot pass to a kernel; pass a NumPy array (np.asarray({name})) "
                     "or a number.")


def explain_failure(call, names, args, exc):
    """A clearer error for numba's typing failure ``exc`` caused by an argument (None,
    a list, an unsupported dtype, a read-only array the kernel writes), or None when no
    argument explains it."""
    try:
        check_arguments(call, names, args)
    except TypeError as clear:
        return clear
    text = str(exc)
    read_only = [n for n, a in zip(names, args) if is_array(a) and not arrays.writeable(a)]
    if read_only and ("Cannot modify readonly array" in text or
                      "setitem(readonly array" in text):
        return _read_only_written(call, read_only, getattr(exc, "loc", None))
    nones = [n for n, a in zip(names, args) if a is None]
    if nones and "none" in text:
        reason = next((ln.strip() for ln in text.splitlines()
                       if ln.strip() and not ln.startswith("Failed in")), text)
        listed = ", ".join(f"'{n}'" for n in nones)
        return TypeError(f"{call}: argument {listed} is None, which the kernel cannot use "
                         f"there (numba: {reason}); pass an array or a number for "
                         f"{listed}.")
    return None


def _read_only_written(call, read_only, loc):
    """The error for a kernel that writes into a read-only array argument (numba
    refuses to type the write, in the forward and in the adjoint alike); ``loc``: the
    write's location, whose source line (its assignment target, else the whole line)
    tells which of several read-only arrays."""
    where = ""
    if loc is not None and getattr(loc, "line", None):
        where = f" at {loc.filename}:{loc.line}"
        line = linecache.getline(loc.filename, loc.line)
        target = re.match(r"([^=]*?)(?:\*\*|//|>>|<<|[-+*/%&|^@])?=(?!=)", line)
        for text in (target.group(1) if target else "", line):
            named = [n for n in read_only if re.search(rf"\b{re.escape(n)}\b", text)]
            if named:
                read_only = named
                break
    if len(read_only) == 1:
        name = read_only[0]
        what = (f"argument '{name}' is read-only ({name}.flags.writeable is False), but "
                f"the kernel writes into it{where}")
        fix = f"pass a writeable array ({name}.copy())"
    else:
        listed = ", ".join(f"'{n}'" for n in read_only)
        what = (f"arguments {listed} are read-only (flags.writeable is False), but the "
                f"kernel writes into one of them{where}")
        fix = "pass writeable arrays (copies) for the arrays the kernel writes"
    return ValueError(f"{call}: {what}, so neither the forward nor its derivatives can "
                      f"run; {fix}.")


# ---- launch configurations ---------------------------------------------------------------
def check_launch(kernel, config):
    """``kernel[grid, block]``, ``[grid, block, stream]`` or ``[grid, block, stream,
    shared]``: 1 to 3 positive integer dimensions each, at most 1024 threads per block.
    ``kernel`` names the launched kernel (``"k"`` or ``"k.adjoint"``)."""
    if not isinstance(config, tuple) or not 2 <= len(config) <= 4:
        raise TypeError(f"{kernel}[{config!r}] needs a launch configuration [grid, block] "
                        "(or [grid, block, stream]); pass both, e.g. "
                        f"{kernel}[(n + 127) // 128, 128].")
    call = f"{kernel}[{', '.join(repr(c) for c in config[:2])}]"
    grid = _dims(call, "grid", config[0], MAX_GRID)
    block = _dims(call, "block", config[1], MAX_BLOCK)
    threads = math.prod(block)
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"{call}: a block of {config[1]!r} has {threads} threads; CUDA "
                         f"allows at most {MAX_THREADS_PER_BLOCK} per block. Use fewer "
                         "threads per block and more blocks.")
    return grid, block


def _dims(call, what, d, limits):
    dims = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    if not 1 <= len(dims) <= 3 or not all(
            isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))
            for x in dims):
        raise TypeError(f"{call}: the {what} dimensions must be 1 to 3 integers, got "
                        f"{d!r}; pass e.g. {what} = (n + 127) // 128 as an int.")
    for k, (x, most) in enumerate(zip(dims, limits)):
        if x < 1:
            raise ValueError(f"{call}: {what} dimension {'xyz'[k]} is {x}; every grid and "
                             "block dimension must be at least 1 (a launch without threads "
                             "computes nothing).")
        if x > most:
            raise ValueError(f"{call}: {what} dimension {'xyz'[k]} is {x}; CUDA allows at "
                             f"most {most}.")
    return tuple(int(x) for x in dims) + (1,) * (3 - len(dims))


# ---- the adjoint call --------------------------------------------------------------------
def check_adjoint_call(call, plan, fwd, adjs, host=False, slot="adjoint"):
    """Check the adjoint buffers ``adjs`` (in slot order) against ``plan`` and the
    forward arguments ``fwd``: types (NumPy arrays when ``host``), shapes, dtypes,
    writeable, no element shared with another element, with a forward argument or with
    another buffer; and no array the kernel writes sharing memory with another
    argument.  ``slot="tangent"``: the same for the tangents of ``k.jvp``, and said
    so."""
    names, written = plan.arg_names, plan.written
    expected = plan.adjoint_names()
    taker = TAKER[slot]
    for i, buf, aname in zip(plan.adjoint_args, adjs, expected):
        _check_buffer(call, names[i], fwd[i], buf, aname, host, slot)
    fmem = [(i, m) for i, a in enumerate(fwd) if (m := arrays.memory(a)) is not None]
    bmem = [(aname, arrays.memory(b)) for aname, b in zip(expected, adjs)]
    for aname, b in zip(expected, adjs):
        if arrays.self_overlapping(b):
            raise ValueError(f"{call}: several elements of {aname} share memory (a "
                             f"broadcast view or a 0 stride), so their {slot}s would be "
                             f"mixed; pass a separate array (np.zeros_like({aname[4:]})).")
    for j, m in fmem:
        if j in written and arrays.self_overlapping(fwd[j]):
            raise ValueError(f"{call}: argument '{names[j]}' is written by the kernel but "
                             "several of its elements share memory (a broadcast view or a "
                             f"0 stride); pass {names[j]}.copy().")
    may = np.may_share_memory   # bounds only: the exact test runs when they meet
    for aname, mb in bmem:
        for i, m in fmem:
            if may(mb[1], m[1]) and _meet(call, mb, m, aname, names[i]):
                raise ValueError(
                    f"{call}: {aname} shares memory with the forward argument "
                    f"'{names[i]}', which {taker} would then modify; {BUFFERS[slot]} "
                    f"must be separate arrays: pass np.zeros_like({names[i]}).")
    for k, (n1, m1) in enumerate(bmem):
        for n2, m2 in bmem[k + 1:]:
            if may(m1[1], m2[1]) and _meet(call, m1, m2, n1, n2):
                raise ValueError(f"{call}: the {BUFFERS[slot]} {n1} and {n2} share "
                                 "memory; pass a separate array for each.")
    for k, (i, m1) in enumerate(fmem):
        for j, m2 in fmem[k + 1:]:
            if (i in written or j in written) and may(m1[1], m2[1]) and \
                    _meet(call, m1, m2, names[i], names[j]):
                r, w = (i, j) if j in written else (j, i)
                raise ValueError(
                    f"{call}: argument '{names[r]}' overlaps '{names[w]}', an array the "
                    "kernel writes; kadj does not differentiate aliased arguments: pass "
                    f"separate arrays (e.g. {names[r]}.copy()).")


class DefaultCotangent(float):
    """The default ``adj_return`` (1.0), told apart from a value the caller passed."""


DEFAULT_ADJ_RETURN = DefaultCotangent(1.0)


def adj_return_value(call, kernel_name, returns_value, value):
    """``adj_return=`` as a float: a number, a 0-d or a 1-element array (the scalar
    convention of adjoint slots).  Refused when the kernel returns no float (given by
    the caller, not defaulted) and for anything else."""
    if not returns_value:
        if value is not DEFAULT_ADJ_RETURN:
            shown = f" ({arrays.describe(value)})" if is_array(value) else f"={value!r}"
            raise TypeError(
                f"{call} got adj_return{shown}, but {kernel_name} returns no "
                "floating-point value, so adj_return (the cotangent of the returned "
                "value) has no meaning; leave it out, and seed the arrays the kernel "
                "writes through their adjoint buffers.")
        return None
    if type(value) is float:
        return value
    if value is DEFAULT_ADJ_RETURN:
        return 1.0
    if isinstance(value, np.ndarray) and value.shape in ((), (1,)):
        value = value.reshape(())[()]
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise TypeError(f"{call}: adj_return must be a number (or a 0-d or 1-element array), "
                    f"the cotangent of the value {kernel_name} returns; got "
                    f"{arrays.describe(value)}. Pass e.g. adj_return=1.0.")


def _check_buffer(call, name, x, buf, aname, host, slot="adjoint"):
    if type(buf) is np.ndarray and type(x) is np.ndarray:  # the common case, quickly
        if buf.shape == x.shape and buf.dtype == x.dtype and buf.flags.writeable:
            return
    if not is_array(buf) or (host and not isinstance(buf, np.ndarray)):
        raise TypeError(f"{call}: {aname} must be a "
                        f"{'NumPy array' if host else 'NumPy or device array'}, got "
                        f"{arrays.describe(buf)}; pass np.zeros_like({name}) for an array "
                        "argument, np.zeros(1) for a scalar.")
    shape, dtype = tuple(buf.shape), np.dtype(buf.dtype)
    if is_array(x):
        want = (tuple(x.shape), np.dtype(x.dtype))
        if shape != want[0] or dtype != want[1]:
            raise ValueError(f"{call}: {aname} must have the shape and dtype of {name} "
                             f"({want[0]}, {want[1]}), got ({shape}, {dtype}); allocate it "
                             f"with np.zeros_like({name}).")
    else:
        want = np.asarray(x).dtype
        if shape != (1,) or dtype != want:
            raise ValueError(f"{call}: {aname} (the {slot} of the scalar {name}) must be "
                             f"a 1-element array of dtype {want}, got shape {shape} and "
                             f"dtype {dtype}; pass np.zeros(1, np.{want.name}).")
    if not arrays.writeable(buf):
        does = "the adjoint accumulates into it" if slot == "adjoint" else \
            "jvp updates the tangents in place"
        raise ValueError(f"{call}: {aname} is read-only, and {does}; pass a writeable "
                         "array.")


def _meet(call, ma, mb, what_a, what_b):
    """:func:`kadj.arrays.shares`, refusing the call when the bounded test cannot
    decide."""
    try:
        return arrays.shares(ma, mb)
    except Undecided:
        raise ValueError(
            f"{call}: kadj cannot tell cheaply whether {what_a} and {what_b} share memory "
            "(their strides make the exact test expensive), so it refuses the call; pass "
            "contiguous copies (np.ascontiguousarray(...)).") from None


# ---- host arrays for a CUDA launch -------------------------------------------------------
def check_transferable(call, names, values):
    """Refuse NumPy arrays numba cannot copy to the GPU for a launch: views that are
    neither C- nor Fortran-contiguous (``x[::2]``, a transposed slice, a broadcast).
    ``names`` name ``values`` (arguments, or adjoint buffers ``adj_<name>``).  Runs
    before anything is transferred, so nothing is copied and nothing is written."""
    for name, a in zip(names, values):
        if isinstance(a, np.ndarray) and not (a.flags.c_contiguous or
                                              a.flags.f_contiguous):
            raise ValueError(
                f"{call}: '{name}' is a non-contiguous NumPy view (shape {a.shape}, "
                f"strides {a.strides}), which numba cannot copy to the GPU; pass "
                f"np.ascontiguousarray({name}) (and copy results back into the view "
                "afterwards), or a device array.")
