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
source kadj shows has its line numbers moved by each function's offset.  The entry's
record is then rewritten with those offsets and the files' new modification times
(:func:`rewritten`), so later loads apply the offsets without reading any source
(:func:`stored`); the module file keeps the line numbers it was written with.
Anything else (a changed line of the kernel, a comment naming a line outside the
recorded functions, two source files with one name) regenerates the entry.
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
    """(relocate, moves): a function that moves the line numbers of an entry's source
    text to where the kernel's functions are now, and the moves it applies
    (``{path: [[first line, lines, offset], ...]}``, for :func:`rewritten`); None when
    the entry cannot be trusted.  ``stale``: the entry's source files that changed
    since its record was written.  The files a rewritten record moved already
    (``line_moves``) are looked at again too: the offsets are from the text's lines."""
    spans = meta.get("kernel_lines")
    if not spans:
        return None
    names = [os.path.basename(p) for p, _ in meta["files"]]
    if len(set(names)) != len(names):
        return None
    stale = set(stale) | set(meta.get("line_moves") or ())
    now = _functions(key, stale)
    moves = {}
    for path, qual, start, n, digest in spans:
        if path not in stale:
            continue
        cur = now.get((path, qual))
        if cur is None or cur[1] != n or cur[2] != digest:
            return None
        moves.setdefault(path, []).append([start, n, cur[0] - start])
    return _relocator(moves, {os.path.basename(p) for p in stale}), moves


def stored(meta):
    """The relocation a rewritten record keeps (:func:`rewritten`), found without
    reading any source: for an entry whose files have not changed since."""
    moves = meta.get("line_moves")
    if not moves:
        return None
    return _relocator(moves, {os.path.basename(p) for p in moves})


def rewritten(meta, moves, mtimes):
    """``meta`` recording ``moves`` (:func:`relocation`) and the source files'
    modification times ``mtimes`` ({path: mtime}, read before the moves were found), so
    that the next load takes :func:`stored`'s path.  The entry's text keeps the line
    numbers it was written with; ``kernel_lines`` stays where the text's lines were."""
    files = [[p, mtimes.get(p, t)] for p, t in meta["files"]]
    kept = {p: m for p, m in moves.items() if any(d for _, _, d in m)}
    return dict(meta, files=files, line_moves=kept)


def _relocator(moves, names):
    """Text -> text with ``file.py:N`` of the files ``names`` moved by ``moves``
    ({path: [[first, lines, offset]]}); raises _Unmapped for a line no span covers."""
    by_name = {}
    for path, spans in moves.items():
        by_name.setdefault(os.path.basename(path), []).extend(spans)

    def move(m):
        name, line = m.group(1), int(m.group(2))
        if name not in names:
            return m.group(0)
        for start, n, delta in by_name.get(name, ()):
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
