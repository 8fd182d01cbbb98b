"""What the command line's ``MODULE:KERNEL --args EXPR`` names: the kernel and its
example arguments (``python -m kadj show`` and ``python -m kadj report``).

``MODULE`` is a dotted module name importable from the current directory, or the path
of a ``.py`` file.  A file inside a package (its directory holds ``__init__.py``) is
imported as that package's module (``kernels/cpu/stencils.py`` as
``kernels.cpu.stencils``, the package's parent directory put on ``sys.path``), so its
relative imports work; any other file is imported by name with its directory on
``sys.path``.  Every failure is a :class:`CliError` whose text is one sentence.
"""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np


class CliError(Exception):
    """A command-line error, explained in one sentence (exit status 2)."""


def one_line(text):
    """``text`` with its whitespace (line breaks included) collapsed to single spaces."""
    return " ".join(str(text).split())


def _module_name(path):
    """(dotted module name, directory to put on sys.path) of a ``.py`` file."""
    directory, base = os.path.split(os.path.abspath(path))
    parts = [os.path.splitext(base)[0]]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    return ".".join(parts), directory


def import_module(spec):
    """The module ``spec`` names (a dotted name or a ``.py`` path)."""
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        if not os.path.isfile(spec):
            raise CliError(f"there is no file {spec!r}")
        name, root = _module_name(spec)
    else:
        name, root = spec, os.getcwd()
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise CliError(f"there is no module {name!r} (importable from "
                           f"{root}); give a dotted module name or a path to a "
                           ".py file") from None
        raise CliError(f"importing {name!r} failed: {one_line(exc)}") from None
    except Exception as exc:  # the module's own code failed: say how, in one line
        raise CliError(f"importing {name!r} raised {type(exc).__name__}: "
                       f"{one_line(exc)}") from None


def _is_kernel(obj):
    return hasattr(obj, "adjoint_source") or hasattr(obj, "py_func")


def load_kernel(target, wrt=None):
    """The differentiated kernel ``target`` (``MODULE:KERNEL``) names."""
    import kadj

    module_spec, sep, attr = target.rpartition(":")
    if not sep or not module_spec or not attr:
        raise CliError(f"expected MODULE:KERNEL (a module name or a .py file, a colon, "
                       f"a kernel's name), got {target!r}")
    module = import_module(module_spec)
    obj = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        kernels = sorted(k for k, v in vars(module).items()
                         if not k.startswith("_") and _is_kernel(v))
        known = f" (its kernels: {', '.join(kernels)})" if kernels else \
            " (it defines no kernels)"
        raise CliError(f"module {module.__name__!r} has no kernel {attr!r}{known}") \
            from None
    if hasattr(obj, "adjoint_source"):
        if wrt is not None:
            raise CliError(f"{attr!r} is differentiated already: --wrt applies only to "
                           "an @njit or @cuda.jit kernel not yet differentiated")
        return obj
    try:
        return kadj.differentiate(obj, wrt=wrt)
    except (TypeError, ValueError) as exc:
        if not _is_kernel(obj):
            raise CliError(f"{attr!r} in {module.__name__!r} is not a kernel (an @njit "
                           f"or @cuda.jit function), it is {type(obj).__name__!r}") \
                from None
        raise CliError(f"cannot differentiate {attr!r}: {one_line(exc)}") from None


def parse_args(expr):
    """The example arguments ``--args`` gives: a Python expression, ``np`` in scope."""
    if not expr:
        return ()
    try:
        args = eval(expr, {"np": np, "numpy": np})  # a command-line expression
    except Exception as exc:
        raise CliError(f"--args {expr!r} does not evaluate ({type(exc).__name__}: "
                       f"{one_line(exc)}); give a Python expression such as "
                       "\"np.zeros(8), np.zeros(8), 0.1\"") from None
    return args if isinstance(args, tuple) else (args,)


def parse_launch(expr):
    """``--launch "GRID, BLOCK"`` of a CUDA kernel: a (griddim, blockdim) tuple."""
    try:
        config = eval(expr, {"np": np})  # a command-line expression
    except Exception as exc:
        raise CliError(f"--launch {expr!r} does not evaluate ({type(exc).__name__}); "
                       "give \"GRID, BLOCK\" such as \"4, 32\"") from None
    if not isinstance(config, tuple) or len(config) != 2:
        raise CliError(f"--launch {expr!r} is not (griddim, blockdim); give "
                       "\"GRID, BLOCK\" such as \"4, 32\"")
    return config


def refusal(kernel, exc):
    """The sentence for an exception raised while building ``kernel``'s adjoint, or
    None when it is not one the command line explains (a bug: let it surface)."""
    from .errors import DifferentiationError

    name = getattr(kernel, "__name__", "kernel")
    if isinstance(exc, DifferentiationError):
        return f"kadj cannot differentiate {name!r}: {one_line(exc)}"
    if isinstance(exc, (TypeError, ValueError)):
        return (f"the arguments given by --args do not fit kernel {name!r}: "
                f"{one_line(exc)}")
    from numba.core.errors import NumbaError
    if isinstance(exc, NumbaError):
        return (f"numba cannot compile {name!r} for the arguments given by --args: "
                f"{one_line(exc)[:400]}")
    return None


def kernel_and_args(opts, example=""):
    """(kernel, example arguments) of a command's ``MODULE:KERNEL``, ``--wrt`` and
    ``--args``."""
    wrt = tuple(w for w in opts.wrt.split(",") if w) if opts.wrt else None
    kernel = load_kernel(opts.target, wrt)
    args = parse_args(opts.args)
    if not args and kernel.arg_names:
        raise CliError(f"--args is needed: example arguments for "
                       f"{kernel.__name__}({', '.join(kernel.arg_names)}){example}")
    return kernel, args


def explained(kernel, build):
    """``build()``, with an exception raised while building ``kernel``'s adjoint turned
    into the :class:`CliError` that explains it (:func:`refusal`)."""
    try:
        return build()
    except CliError:
        raise
    except Exception as exc:
        why = refusal(kernel, exc)
        if why is None:
            raise
        raise CliError(why) from None
