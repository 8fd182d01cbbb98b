"""The globals a CPU kernel's forward was compiled with, and those its adjoint sees.

numba freezes what a kernel reads from module globals (numbers, tuples, arrays and
their contents, the jitted helpers it calls) when it compiles the kernel for a
signature; kadj freezes them when it builds the adjoint.  A global rebound in between
(``DT = 0.02`` in a notebook cell) or an array changed in place (``W[:] = ...``)
would make the adjoint the derivative of another function than the forward that
runs, with no error.  :class:`FrozenGlobals` keeps them one:

- after a forward call that made numba compile a new signature (a new entry in the
  dispatcher's ``overloads``), it fingerprints the globals the kernel's code names
  (:class:`kadj.cachekey.Fingerprint`, one digest per name: helpers with their own
  globals, arrays by content, closure cells too); an adjoint already built for that
  signature under other globals is dropped, to be built again with the forward's;
- when an adjoint is built for a signature the forward has compiled, the globals must
  still be those: otherwise :class:`~kadj.DifferentiationError` names them and says
  to call ``kernel.recompile()`` (numba compiles the forward again with the current
  values, and the adjoints follow) or to pass the value as an argument.

Calls of the numba dispatcher that bypass kadj (another jitted function calling the
kernel) compile unseen; a name whose value the fingerprint can only name by identity
(an instance of a user class) is not compared.
"""
from __future__ import annotations

import threading

from .cachekey import Fingerprint, _code_names
from .errors import DifferentiationError

__all__ = ["FrozenGlobals"]


def snapshot(py_func):
    """{name: digest} of the globals and closure cells ``py_func`` reads (None for a
    value the fingerprint can only name by identity)."""
    code = py_func.__code__
    names = _code_names(code)
    glb = py_func.__globals__
    out = {}
    for name in sorted(names):
        if name in glb:
            out[name] = _digest(glb[name], names)
    for name, cell in zip(code.co_freevars, py_func.__closure__ or ()):
        try:
            out[name] = _digest(cell.cell_contents, names)
        except ValueError:          # an empty cell
            out[name] = "empty"
    return out


def _digest(value, names):
    fp = Fingerprint()
    try:
        fp.add(value, names)
    except Exception:       # a value the walk cannot take: not compared
        return None
    return None if fp.unstable else fp.hexdigest()


def changed(before, now):
    """Names whose digests differ (both known)."""
    return sorted(n for n in set(before) | set(now)
                  if before.get(n) is not None and now.get(n) is not None
                  and before.get(n) != now.get(n)
                  or (n in before) != (n in now))


class FrozenGlobals:
    """Per forward signature (a tuple of numba types, the dispatcher's ``overloads``
    key), the globals when numba compiled it and when kadj built its adjoint."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled = {}      # signature -> snapshot at the forward's compilation
        self.built = {}         # signature -> snapshot at the adjoint's build
        self.lock = threading.Lock()

    def after_forward(self):
        """After a forward call whose dispatcher gained overloads: note them, and drop
        adjoints built under other globals."""
        sigs = [s for s in list(self.kernel.dispatcher.overloads) if s not in self.compiled]
        if not sigs:
            return
        now = snapshot(self.kernel.py_func)
        stale = False
        with self.lock:
            for sig in sigs:
                self.compiled[sig] = now
                built = self.built.get(sig)
                if built is not None and changed(built, now):
                    stale = True
                    del self.built[sig]
        if stale:
            self.kernel._forget_adjoints()

    def before_build(self, arg_types):
        """Before the adjoint for ``arg_types`` is built: refuse when the forward was
        compiled for them under other globals."""
        sig = tuple(arg_types)
        now = snapshot(self.kernel.py_func)
        then = self.compiled.get(sig)
        if then is not None:
            names = changed(then, now)
            if names:
                shown = ", ".join(f"'{n}'" for n in names)
                raise DifferentiationError(
                    f"the global(s) {shown} that the kernel reads changed after numba "
                    "compiled its forward for these argument types (numba froze their "
                    "values then, so the forward still runs with the old ones); an "
                    "adjoint built now would be the derivative of another function",
                    kernel=self.kernel.__name__, construct="global changed after "
                    "compilation",
                    remedy=f"call {self.kernel.__name__}.recompile() to compile the "
                           "forward again with the current values (its adjoints "
                           "follow), or pass the value as an argument")
        with self.lock:
            self.built[sig] = now

    def forget(self):
        with self.lock:
            self.compiled.clear()
            self.built.clear()
