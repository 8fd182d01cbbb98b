"""A kernel's cost card: what its adjoint costs (``python -m kadj report``).

:func:`build` gathers, for a differentiated kernel at example arguments:

* ``adjoint_lines``: code lines of the generated adjoint (comments, docstring and blank
  lines left out; a CUDA kernel's scatter form);
* ``recorded_values`` and ``tape_bytes``: what the adjoint records on its tape, per call
  on a CPU (measured by :mod:`kadj.tape_measure`), per thread on a GPU (the bounded
  tape's size, from the adjoint report); ``tape_per`` says which;
* ``accumulation``: how the adjoint accumulates into each argument (``none``, ``plain``,
  ``block-reduced``, ``atomic``) and, for CUDA, ``access``: each array's access class;
* ``atomics`` / ``atomics_gather``: atomic instructions (``atom.*``, ``red.*``) in the PTX
  of the CUDA adjoint's scatter and gather forms (``numba.cuda.compile_ptx``, no GPU
  needed); ``registers`` / ``local_memory``: per thread, on a GPU only;
* ``forward_s``, ``adjoint_s`` and ``adjoint_over_forward``: median times of a few calls
  (CPU; CUDA on a GPU only, with device arrays and a synchronisation).

A value that cannot be had here is a string ``"n/a (why)"``.  :func:`to_table` prints the
card; :func:`regressions` compares it with a saved one (``--baseline``).
"""
from __future__ import annotations

import re

import numpy as np

from .timing import median_time
from .tape_measure import TooLarge, adjoint_buffers, bounded_usage, cpu_tape_usage

# accumulation modes from cheapest to dearest: a move to the right is a regression
RANK = {"none": 0, "plain": 1, "block-reduced": 2, "atomic": 3}
_ATOMIC = re.compile(r"^\s*(?:@!?%\w+\s+)?(?:atom|red)\.[\w.]+")


def count_atomics(ptx):
    """Atomic instructions (``atom.*`` and ``red.*``) in a PTX text."""
    return sum(1 for line in ptx.splitlines() if _ATOMIC.match(line))


def code_lines(source):
    """Lines of ``source`` that are code (not blank, not comments, not the docstring)."""
    n, in_doc = 0, False
    for line in source.splitlines():
        s = line.strip()
        if in_doc:
            in_doc = not (s.endswith('"""') or s.endswith("'''"))
            continue
        if s.startswith(('"""', "'''")):
            in_doc = len(s) < 6 or not s.endswith(s[:3])
            continue
        if s and not s.startswith("#"):
            n += 1
    return n


def _is_cuda(kernel):
    return getattr(kernel, "target_name", "cpu") == "cuda"


def build(kernel, args, config=None, repeat=5, timing=True):
    """The cost card of ``kernel`` (a differentiated kernel) at ``args`` (a CUDA
    kernel's launch ``config`` is needed for its timing)."""
    args = tuple(kernel.complete_args(tuple(args)))
    comp = kernel.compiled(*args)
    card = {"kernel": kernel.__name__, "target": "cuda" if _is_cuda(kernel) else "cpu",
            "adjoint_lines": code_lines(comp.source)}
    if _is_cuda(kernel):
        card.update(_cuda_static(kernel, comp, args))
        card.update(_cuda_timing(kernel, comp, args, config, repeat) if timing else
                    _no_timing("not asked for"))
    else:
        card.update(_cpu_static(kernel, comp, args))
        card.update(_cpu_timing(kernel, comp, args, repeat) if timing else
                    _no_timing("not asked for"))
    return card


def _no_timing(why):
    na = f"n/a ({why})"
    return {"forward_s": na, "adjoint_s": na, "adjoint_over_forward": na}


def _tape_fields(usage, per):
    return {"recorded_values": sum(n for n, _ in usage.values()),
            "tape_bytes": sum(b for _, b in usage.values()),
            "tape_by_kind": {k: n for k, (n, _) in usage.items()}, "tape_per": per}


def _cpu_static(kernel, comp, args):
    out = {}
    try:
        out.update(_tape_fields(cpu_tape_usage(kernel, args), "call"))
    except TooLarge:
        na = "n/a (arguments too large to measure the tape: give smaller --args)"
        out.update(recorded_values=na, tape_bytes=na, tape_by_kind={}, tape_per="call")
    mode = kernel.target.accumulation
    out["accumulation"] = {comp.plan.arg_names[i]: mode for i in comp.plan.adjoint_args}
    na = "n/a (CPU kernel)"
    out.update(atomics=na, atomics_gather=na, registers=na, local_memory=na)
    return out


def _cuda_static(kernel, comp, args):
    report = comp.report
    out = _tape_fields(bounded_usage(report.get("tape", {})), "thread")
    acc, access = {}, {}
    for name, a in report.get("arrays", {}).items():
        acc[name], access[name] = a["accumulation"], a["class"]
    for name, how in report.get("scalars", {}).items():
        acc[name] = str(how).split(":")[0].strip()
    out["accumulation"], out["access"] = acc, access
    out["atomics"] = _ptx_atomics(kernel, args, "scatter")
    out["atomics_gather"] = (_ptx_atomics(kernel, args, "gather")
                             if comp.gather is not None else "n/a (no gather form)")
    out.update(_resources(kernel, args))
    return out


def _ptx_atomics(kernel, args, form):
    try:
        return count_atomics(kernel.adjoint_ptx(*args, form=form))
    except Exception as exc:  # no NVVM, or compiling failed: say so in the card
        why = " ".join(str(exc).split())[:160]
        return f"n/a (PTX not available: {type(exc).__name__}: {why})"


def gpu_present():
    """Whether a CUDA GPU runs kernels here (:func:`kadj.cuda.cost.gpu_present`)."""
    from .cuda.cost import gpu_present as present
    return present()


def _resources(kernel, args):
    if not gpu_present():
        return {"registers": "n/a (no GPU)", "local_memory": "n/a (no GPU)"}
    res = kernel.adjoint_resources(*args)
    return {"registers": int(res["registers"]),
            "local_memory": int(res["local_memory_per_thread"])}


def _cpu_timing(kernel, comp, args, repeat):
    work = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    seeds = adjoint_buffers(comp.plan, args)
    bufs = [s.copy() for s in seeds]

    def refill_args():
        for w, a in zip(work, args):
            if isinstance(a, np.ndarray):
                np.copyto(w, a)

    def refill_seeds():
        for b, s in zip(bufs, seeds):
            np.copyto(b, s)

    kernel.forward(*work)
    refill_args()
    kernel.adjoint(*work, *bufs)            # compiled before timing
    t_fwd = median_time(lambda: kernel.forward(*work), repeat, refill_args)
    refill_args()
    t_adj = median_time(lambda: kernel.adjoint(*work, *bufs), repeat, refill_seeds)
    return _times(t_fwd, t_adj)


def _times(t_fwd, t_adj):
    ratio = t_adj / t_fwd if t_fwd > 0 else float("inf")
    return {"forward_s": t_fwd, "adjoint_s": t_adj, "adjoint_over_forward": ratio}


def _cuda_timing(kernel, comp, args, config, repeat):
    if not gpu_present():
        return _no_timing("no GPU")
    if config is None:
        return _no_timing("give the launch with --launch")
    from .cuda.cost import adjoint_launcher, forward_launcher
    fwd = forward_launcher(kernel, args, config)
    adj = adjoint_launcher(kernel, args, adjoint_buffers(comp.plan, args), config)
    fwd()
    adj()
    return _times(median_time(fwd, repeat), median_time(adj, repeat))


# ---- printing and comparing -----------------------------------------------------------


def _size(b):
    if not isinstance(b, (int, float)):
        return str(b)
    for unit, scale in (("MB", 1 << 20), ("kB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b} B"


def _seconds(t):
    return f"{t * 1e3:.4g} ms" if isinstance(t, (int, float)) else str(t)


def to_table(card):
    """The card as an aligned text table."""
    per = card.get("tape_per", "call")
    rows = [("adjoint lines", card["adjoint_lines"]),
            (f"recorded values / {per}", card["recorded_values"]),
            (f"tape bytes / {per}", _size(card["tape_bytes"]))]
    access = card.get("access", {})
    for name, how in card["accumulation"].items():
        cls = f" ({access[name]} access)" if name in access else ""
        rows.append((f"accumulation {name}", how + cls))
    rows += [("atomics in PTX (scatter)", card["atomics"]),
             ("atomics in PTX (gather)", card["atomics_gather"]),
             ("registers / thread", card["registers"]),
             ("local memory / thread", _size(card["local_memory"])),
             ("forward", _seconds(card["forward_s"])),
             ("adjoint", _seconds(card["adjoint_s"]))]
    ratio = card["adjoint_over_forward"]
    rows.append(("adjoint / forward",
                 f"{ratio:.2f}x" if isinstance(ratio, (int, float)) else ratio))
    width = max(len(k) for k, _ in rows)
    head = f"kadj cost card: {card['kernel']} ({card['target'].upper()})"
    return "\n".join([head] + [f"  {k:<{width}}  {v}" for k, v in rows]) + "\n"


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def regressions(card, baseline, threshold=1.25):
    """What got worse from ``baseline`` (a saved card) to ``card``, one line each:
    adjoint/forward beyond ``threshold`` times the baseline's, more atomics or tape
    bytes, an argument's accumulation dearer (``RANK``)."""
    out = []
    old, new = baseline.get("adjoint_over_forward"), card.get("adjoint_over_forward")
    if _number(old) and _number(new) and new > old * threshold:
        out.append(f"adjoint/forward {new:.2f}x exceeds the baseline's {old:.2f}x by "
                   f"more than the threshold {threshold:g}x (limit {old * threshold:.2f}x)")
    for field in ("atomics", "atomics_gather", "tape_bytes"):
        old, new = baseline.get(field), card.get(field)
        if _number(old) and _number(new) and new > old:
            out.append(f"{field} grew from {old} to {new}")
    old_acc = baseline.get("accumulation", {})
    for name, how in card.get("accumulation", {}).items():
        before = old_acc.get(name)
        if before in RANK and how in RANK and RANK[how] > RANK[before]:
            out.append(f"accumulation into {name!r} got dearer: {before} -> {how}")
    return out
