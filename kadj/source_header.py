"""The import lines that make a generated adjoint's source run as printed.

A generated adjoint names modules (``math``, ``np``, ``cuda``), numba types
(``_float64``) and kadj's runtime helpers (``_reserve``, ``_trips``).  :func:`header`
turns the names the body uses into import statements, so the source shown to the user
is exactly the source that runs: executed alone, in an empty namespace, it defines the
adjoint.  Objects with no importable name (a user's jitted helper or device function, a
global array, a custom derivative rule) cannot be imported; they are supplied by kadj
when it runs the source, and a comment line of the header names them.

An object is imported only from Python's own modules, NumPy, Numba, llvmlite or kadj
(whose versions the disk cache's key records), and only when importing the name gives
back the very same object; anything else is supplied.
"""
from __future__ import annotations

import importlib
import re
import sys
import warnings

from .cachekey import _VERSIONED, _root

SUPPLIED_NOTE = "# supplied by kadj when it runs this source (no importable name): "


def _used(name, body):
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", body) is not None


def _type_import(obj):
    """(module, attribute) that names the numba type ``obj``, or None."""
    import numba
    from numba.core import types as nbtypes
    if getattr(numba, str(obj), None) is obj:
        return "numba", str(obj)
    for attr in sorted(vars(nbtypes)):
        if not attr.startswith("_") and getattr(nbtypes, attr) is obj:
            return "numba.core.types", attr
    return None


def _import_of(name, obj):
    """("import", text) or ("from", module, attribute) binding ``name`` to ``obj``, or
    None when ``obj`` has no importable name."""
    from numba.core import types as nbtypes
    if isinstance(obj, type(sys)):
        mod = obj.__name__
        if sys.modules.get(mod) is not obj or _root(mod) not in _VERSIONED:
            return None
        parent, _, last = mod.rpartition(".")
        if parent and last == name:
            return ("from", parent, last)
        return ("import", mod if mod == name else f"{mod} as {name}")
    if isinstance(obj, nbtypes.Type):
        found = _type_import(obj)
        return None if found is None else ("from", *found)
    module = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if _root(module) not in _VERSIONED or not isinstance(qual, str) or \
            "<" in qual or "." in qual:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            found = getattr(importlib.import_module(module), qual)
    except (ImportError, AttributeError):
        return None
    return ("from", module, qual) if found is obj else None


def header(body, namespace):
    """(header text, supplied): the import lines (and the note naming the supplied
    objects) for the names of ``namespace`` that ``body`` uses, and the dict of the
    objects that could not be imported."""
    imports, froms, supplied = [], {}, {}
    for name, obj in sorted(namespace.items()):
        if not _used(name, body):
            continue
        how = _import_of(name, obj)
        if how is None:
            supplied[name] = obj
        elif how[0] == "import":
            imports.append(f"import {how[1]}")
        else:
            _, module, attr = how
            froms.setdefault(module, []).append(attr if attr == name else
                                                f"{attr} as {name}")
    lines = sorted(imports, key=lambda s: (s.split()[1].split(".")[0] != "math", s))
    lines += [f"from {m} import {', '.join(sorted(names))}"
              for m, names in sorted(froms.items(), key=lambda kv: (
                  kv[0].startswith("kadj"), kv[0]))]
    if supplied:
        lines.append(SUPPLIED_NOTE + ", ".join(sorted(supplied)))
    return ("\n".join(lines) + "\n\n\n" if lines else ""), supplied


def self_contained(body, namespace):
    """(source, supplied): ``body`` with its :func:`header` in front."""
    head, supplied = header(body, namespace)
    return head + body, supplied
