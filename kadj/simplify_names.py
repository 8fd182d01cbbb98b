"""Readability pass over the adjoint IR: a temporary's name loses the suffix it no longer
needs.

A temporary loaded from ``c[i]`` is named ``c_i``; a second load of the same element is
``c_i_2`` (:meth:`kadj.adj_naming.Naming.unique`), and a block's own copy of a name is
``x_2`` (:mod:`kadj.simplify_scopes`).  When the readability passes have folded or
dropped every occurrence of the plain name, :func:`drop_free_suffixes` gives the
suffixed one (and its adjoint ``adj_c_i_2``) the plain name back.  That is a renaming
of one variable to a name that occurs nowhere in the function, not even in a comment,
so the adjoint computes exactly what it did.
"""
from __future__ import annotations

import dataclasses
import re

from . import adj_ir as A
from .adj_refs import rename
from .printer import render

_SUFFIXED = re.compile(r"(?P<base>[A-Za-z_]\w*?)_(?P<k>[2-9]|[1-9]\d+)\Z")
_WORD = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


def drop_free_suffixes(fn):
    """``c_i_2`` -> ``c_i`` (and ``adj_c_i_2`` -> ``adj_c_i``) where the plain name
    occurs nowhere in ``fn`` (see the module docstring); returns ``fn``."""
    suffixed = [name for name in sorted(fn.temps, key=_order) if _SUFFIXED.match(name)]
    if not suffixed:
        return fn       # (no name to give back: the function need not be printed)
    taken = set(_WORD.findall(render(fn))) | set(fn.params)
    for name in suffixed:
        m = _SUFFIXED.match(name)
        # the temporary and its adjoint are renamed together, so that ``adj_c_i``
        # still reads as the adjoint of ``c_i``
        base = m.group("base")
        pairs = [(name, base), (f"adj_{name}", f"adj_{base}")]
        if not any(old in taken for old, _ in pairs) or any(
                new in taken or old in fn.params or _in_comment(fn, old)
                for old, new in pairs):
            continue
        for old, new in pairs:
            if old in taken:
                _rename_all(fn, old, new)
                taken.discard(old)
            taken.add(new)
    return fn


def _order(name):
    m = _SUFFIXED.match(name)
    return (m.group("base"), int(m.group("k"))) if m else (name, 0)


def _in_comment(fn, name):
    pat = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
    return any(isinstance(x, A.Comment) and pat.search(x.text)
               for x in A.walk(fn.prologue + fn.body))


def _rename_all(fn, old, new):
    def r(v):
        if isinstance(v, str):
            return rename(v, old, new)
        if isinstance(v, tuple):
            return tuple(r(e) for e in v)
        if isinstance(v, dict):
            return {k: r(e) for k, e in v.items()}
        if isinstance(v, A.AdjVar):
            return dataclasses.replace(v, name=r(v.name))
        if isinstance(v, A.AdjElem):
            return dataclasses.replace(v, base=r(v.base), index_texts=r(v.index_texts))
        if isinstance(v, A.Local):
            return dataclasses.replace(v, name=r(v.name))
        return v
    for x in A.walk(fn.prologue + fn.body):
        if isinstance(x, A.Comment):
            continue
        for f in dataclasses.fields(x):
            if f.name in ("frame", "loc") or isinstance(getattr(x, f.name), list):
                continue
            setattr(x, f.name, r(getattr(x, f.name)))
    if old in fn.temps:
        fn.temps = (frozenset(fn.temps) - {old}) | {new}
