"""Where a cached adjoint's kernel lines are now: an entry survives edits elsewhere in
the kernel's file.

A generated adjoint names lines of the user's files only in its comments
(``# model.py:42: v[i] = ...``, ``# save t4 (overwritten at model.py:57)``); its code
depends on the kernel's bytecode and values, which the key covers
(:mod:`kadj.cachekey`).  So when a source file of an entry is no longer the one it was
written from (its modification time changed), the entry is still right if every
function the kernel's code came from (the kernel and its jitted callees, found through
the key's fingerprint) has exactly the same source lines as when the entry was written,
possibly at another position.  The entry's functions are then used as they are (the
module file and numba's compiled code are unchanged, so nothing is recompiled) and the
source kadj shows has its line numbers moved by each function's offset.  Anything else
(a changed line of the kernel, a comment naming a line outside the recorded functions,
two source files with one name) regenerates the entry.
"""
from __future__ import annotations

import hashlib
import inspect
import linecache
import os
import re
import types as pytypes

from .cachekey import fingerprint_objects

_REF = re.compile(r"(?<![\w.-])([\w.-]+\.py):(\d+)")


class _Unmapped(Exception):
    pass


def _functions(key, files):
    """{(path, qualname): (first line, number of lines, sha256)} of the Python functions
    of the key's fingerprint defined in ``files``."""
    out = {}
    for obj in fingerprint_objects(key):
        fn = getattr(obj, "py_func", obj)
        if not isinstance(fn, pytypes.FunctionType):
            continue
        path = fn.__code__.co_filename
        if path not in files:
            continue
        linecache.checkcache(path)
        try:
            lines, start = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            continue
        digest = hashlib.sha256("".join(lines).encode()).hexdigest()
        out[(path, fn.__qualname__)] = (start, len(lines), digest)
    return out


def record(key, files):
    """The ``kernel_lines`` field of a new entry: [path, qualname, first line, lines, sha256]
    of every function of the kernel's code in ``files``."""
    found = _functions(key, set(files))
    return [[p, q, s, n, d] for (p, q), (s, n, d) in sorted(found.items())]


def relocation(meta, key, stale):
    """A function that moves the line numbers of an entry's source text to where the
    kernel's functions are now, or None when the entry cannot be trusted.  ``stale``:
    the entry's source files that changed since it was written."""
    spans = meta.get("kernel_lines")
    if not spans:
        return None
    names = [os.path.basename(p) for p, _ in meta["files"]]
    if len(set(names)) != len(names):
        return None
    now = _functions(key, set(stale))
    moves = {}
    for path, qual, start, n, digest in spans:
        if path not in stale:
            continue
        cur = now.get((path, qual))
        if cur is None or cur[1] != n or cur[2] != digest:
            return None
        moves.setdefault(os.path.basename(path), []).append((start, n, cur[0] - start))
    stale_names = {os.path.basename(p) for p in stale}

    def move(m):
        name, line = m.group(1), int(m.group(2))
        if name not in stale_names:
            return m.group(0)
        for start, n, delta in moves.get(name, ()):
            if start <= line < start + n:
                return f"{name}:{line + delta}"
        raise _Unmapped(m.group(0))

    def relocate(text):
        return _REF.sub(move, text)

    return relocate


def checked(relocate, text):
    """``relocate(text)``, or None when the text names a line no function covers."""
    try:
        return relocate(text)
    except _Unmapped:
        return None
