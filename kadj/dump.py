"""Printable forms of the stages' outputs: the region tree of a kernel and the facts
the analysis found about it.  Both are deterministic (no ``id()`` values, sets sorted),
so they can be compared as text.

    >>> print(kadj.dump.region(kernel))      # structured statements, loops and ifs
    >>> print(kadj.dump.facts(facts))        # one fact a line

In the facts, a loop is named by its header and source line
(``for i in range(1, t3): [heat.py:6]``), a statement by its text.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields

from . import ir

_TEMP = re.compile(r"\$[\w.]+")


def temp_names(kernel):
    """Short names for numba's temporaries (``$binop_sub44.8`` -> ``t3``), numbered in
    the order the region tree defines them, avoiding the kernel's own names."""
    taken = set(kernel.types) | set(kernel.args)
    out = {}

    def name(v):
        if v.startswith("$") and v not in out:
            k = len(out) + 1
            while f"t{k}" in taken:
                k += 1
            out[v] = f"t{k}"
            taken.add(out[v])

    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign):
            name(s.target)
    for s in ir.walk(kernel.body):
        for v in sorted(ir.stmt_reads(s)):
            name(v)
    return out


def _renamer(kernel, raw):
    if raw:
        return lambda text: text
    names = temp_names(kernel)
    return lambda text: _TEMP.sub(lambda m: names.get(m.group(0), m.group(0)), text)


def _natural(text):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def region(kernel, locs=True, raw=False) -> str:
    """The region tree of ``kernel``: a header line with its name and arguments, then
    its statements (``ir.fmt``), each ending with ``# file.py:line`` when ``locs``.
    Numba's temporaries are shown as ``t1``, ``t2``, ... unless ``raw``."""
    head = f"kernel {kernel.name}({', '.join(kernel.args)}):"
    body = ir.fmt(kernel.body, 1, locs=locs) or "    pass"
    return _renamer(kernel, raw)(f"{head}\n{body}\n")


def stmt_line(s, locs=True) -> str:
    """One statement on one line: a simple statement's text, a loop's or an if's
    header, with ``[file.py:line]`` when ``locs`` (raw variable names)."""
    text = ir.header(s)
    where = ir.loc_text(getattr(s, "loc", None)) if locs else ""
    return f"{text} [{where}]" if where else text


def _inline(s):
    """A statement with its nested statements on one line (recomputed ifs)."""
    if isinstance(s, ir.If):
        out = f"if {ir._o(s.cond)}: {{{'; '.join(map(_inline, s.then))}}}"
        if s.orelse:
            out += f" else: {{{'; '.join(map(_inline, s.orelse))}}}"
        return out
    return ir.header(s)


def facts(f, locs=True, raw=False) -> str:
    """Each non-empty fact of ``f`` (a :class:`kadj.analysis.Facts`), one a line: sets
    sorted, per-loop facts one line per loop (``name[loop]: ...``) in source order,
    per-statement facts (``has_rev`` of loops and ifs, ``replay_fresh``) as statement
    text.  Temporaries are named as in :func:`region` unless ``raw``."""
    rename = _renamer(f.kernel, raw)
    order = list(ir.walk(f.kernel.body))
    loops = {s.uid: s for s in order if isinstance(s, (ir.ForRange, ir.Loop))}
    by_id = {id(s): s for s in order}
    position = {id(s): k for k, s in enumerate(order)}

    def loop_name(uid):
        s = loops.get(uid)
        return stmt_line(s, locs) if s is not None else f"loop {uid}"

    def loop_key(uid):
        s = loops.get(uid)
        return position[id(s)] if s is not None else len(order) + uid

    def values(v):
        if isinstance(v, (set, frozenset)):
            return ", ".join(sorted((rename(str(x)) for x in v), key=_natural))
        if isinstance(v, tuple):
            return ", ".join(rename(str(x)) for x in v)
        return rename(str(v))

    lines = [f"kernel: {f.kernel.name}"]
    policy = f.policy
    for fl in fields(policy):
        v = getattr(policy, fl.name)
        if v:
            lines.append(f"policy.{fl.name}: {values(v) if v is not True else 'yes'}")
    for fl in fields(f):
        name = fl.name
        if name in ("kernel", "policy"):
            continue
        v = getattr(f, name)
        if not v:
            continue
        if name == "has_rev":
            stmts = sorted((by_id[k] for k, r in v.items() if r and k in by_id and
                            isinstance(by_id[k], (ir.If, ir.ForRange, ir.Loop))),
                           key=lambda s: position[id(s)])
            lines += [f"has_rev: {stmt_line(s, locs)}" for s in stmts]
        elif name == "replay_fresh":
            stmts = sorted((by_id[k] for k in v if k in by_id),
                           key=lambda s: position[id(s)])
            lines += [f"replay_fresh: {stmt_line(s, locs)}" for s in stmts]
        elif name == "assign_count":
            lines.append("assign_count: " + ", ".join(sorted(
                (f"{rename(k)}={n}" for k, n in v.items()), key=_natural)))
        elif name in _LOOP_FACTS:
            for uid in sorted(v, key=loop_key):
                item = v[uid]
                if not item:
                    continue
                if name == "recompute":
                    text = "; ".join(map(_inline, item))
                else:
                    text = values(item)
                lines.append(f"{name}[{loop_name(uid)}]: {text}")
        elif name in _LOOP_SETS:
            for uid in sorted(v, key=loop_key):
                lines.append(f"{name}: {loop_name(uid)}")
        elif isinstance(v, Mapping):
            lines += [f"{name}[{k}]: {values(x)}" for k, x in sorted(v.items()) if x]
        else:
            lines.append(f"{name}: {values(v)}")
    return rename("\n".join(lines) + "\n")


# per-loop facts: dicts keyed by loop uid, and sets of loop uids
_LOOP_FACTS = {"recompute", "recompute_vars", "replay", "loop_saved", "loop_unsaved",
               "checkpoint",
               "checkpoint_owned", "replay_shared", "checkpoint_arrays"}
_LOOP_SETS = {"index_saved", "ascending", "force_replay"}
