"""The Tape: record a sequence of kernel launches, replay their adjoints in reverse.

What it establishes.  After ``tape.backward(...)``, ``tape.grad(x)`` is the cotangent
of ``x``'s contents *before the first recorded launch that touched it*, for the map
from the initial state of every array the tape saw to the seeded final state.  This
is the composition rule of API.md: each adjoint maps the cotangent of its launch's
post-call state to that of its pre-call state, so replaying the adjoints in reverse
over one adjoint buffer per array yields the gradient of the whole sequence.

How.  Each adjoint must run on its launch's *pre-call* arguments.  Arrays are
tracked by their exact memory view (data pointer, shape, strides, dtype; the tape
keeps a reference, so the memory is not reused while it is recorded), and every
recorded write starts a new *version* of the array.  Before a launch writes an
array, the tape copies its current contents if they will be needed: when this
launch reads the array too (an in-place update), or when an earlier launch read
that version.  Versions that nobody reads are never copied, and the newest version
of an array is the live array itself.  ``Tape(copy_inputs=False)`` never copies and
instead refuses, before the forward runs, a launch that would overwrite what an
adjoint needs, naming both launches and the argument.  Scalars are kept as passed.

CUDA launches (``k[grid, block](...)`` inside ``with tape``) are recorded with their
configuration and replayed as ``k.adjoint[grid, block, ...]``; their arrays may be
NumPy arrays, numba device arrays or CuPy arrays, and the tape's copies and adjoint
buffers live where each array lives (``tape.grad(x)`` is of the same kind as ``x``).

Limitations.  Modifications made outside recorded launches (``u[:] = 0`` in Python
between launches, or to the arrays after recording) are invisible to the tape: the
live arrays must still hold their newest recorded contents when ``backward`` runs,
and an unrecorded modification is treated as the identity.  Arrays that overlap in
memory without being the same view are refused.  A value returned by a recorded
launch cannot be seeded (write it into an array instead).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .errors import DifferentiationError, InternalError

__all__ = ["Launch", "ScalarGrad", "Tape", "active"]

_local = threading.local()


def _stack():
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def active():
    """The innermost active :class:`Tape` of this thread, or None."""
    stack = _stack()
    return stack[-1] if stack else None


@dataclass(frozen=True)
class Launch:
    """One recorded launch.

    kernel:    the differentiated kernel.
    args:      the arguments as passed (arrays by reference, scalars by value).
    config:    the launch configuration (grid, block, stream); None on the CPU.
    plan:      the kernel's adjoint plan for these arguments.
    index:     position on the tape, from 0.
    keys:      per argument, the tracked array's key, or None for a scalar.
    versions:  per argument, the array's version before the call, or None.
    """

    kernel: object
    args: tuple
    config: object = None
    plan: object = field(default=None, kw_only=True)
    index: int = field(default=0, kw_only=True)
    keys: tuple = field(default=(), kw_only=True)
    versions: tuple = field(default=(), kw_only=True)

    def describe(self):
        return f"launch #{self.index} (kernel '{self.plan.kernel_name}')"

    def arg_name(self, i):
        return self.plan.arg_names[i]


@dataclass(frozen=True)
class ScalarGrad:
    """The gradient with respect to one scalar argument of one launch."""

    launch: int
    kernel_name: str
    arg_name: str
    value: float


@dataclass(frozen=True)
class _Reader:
    """A recorded launch that reads one version of an array, as argument ``arg``."""

    launch: int
    arg: int


class _TrackedArray:
    """Mutable bookkeeping for one array the tape has seen."""

    __slots__ = ("array", "version", "snapshots", "readers")

    def __init__(self, array):
        self.array = array        # the live array (a reference keeps its memory)
        self.version = 0          # bumped by every recorded launch that writes it
        self.snapshots = {}       # version -> copy of the contents of that version
        self.readers = {}         # version -> [_Reader]

    def contents(self, version):
        if version in self.snapshots:
            return self.snapshots[version]
        if version == self.version:
            return self.array
        return None


class Tape:
    """Records kernel launches and computes gradients through the whole sequence.

    Example::

        with kadj.Tape() as tape:
            heat_step(u0, u1, 0.1)
            heat_step(u1, u2, 0.1)
            loss_kernel(u2, target, loss)     # loss: a 1-element array
        tape.backward(loss)
        g_u0 = tape.grad(u0)

    ``copy_inputs=False`` makes the tape refuse, instead of copying, a launch that
    would overwrite an array that a recorded adjoint still needs.
    """

    def __init__(self, *, copy_inputs=True):
        self.copy_inputs = bool(copy_inputs)
        self.reset()

    # ------------------------------------------------------------- activation

    def __enter__(self):
        stack = _stack()
        if any(t is self for t in stack):
            raise DifferentiationError(
                "This tape is already active; a tape cannot be entered again while "
                "it is recording.")
        stack.append(self)
        return self

    def __exit__(self, *exc_info):
        stack = _stack()
        if not stack or stack[-1] is not self:
            raise InternalError("tapes were exited in a different order than entered")
        stack.pop()
        return False

    def __repr__(self):
        return (f"Tape({len(self._launches)} launches, {len(self._arrays)} arrays, "
                f"{self.snapshot_count} snapshots)")

    @property
    def launches(self):
        """The recorded launches, in order."""
        return tuple(self._launches)

    @property
    def snapshot_count(self):
        """How many array copies the tape keeps."""
        return sum(len(t.snapshots) for t in self._arrays.values())

    # -------------------------------------------------------------- recording

    def record(self, kernel, args, config=None):
        """Run ``kernel.forward(*args)`` and record it; return the forward's result.

        Called by a differentiated kernel when this tape is active.
        """
        args = tuple(args)
        index = len(self._launches)
        plan = kernel.adjoint_plan(*args)
        keys = tuple(self._track(plan, index, i, a) if _is_array(a)
                     else _check_value(plan, index, i, a) for i, a in enumerate(args))
        _check_aliasing(plan, index, keys)
        versions = tuple(None if k is None else self._arrays[k].version for k in keys)
        launch = Launch(kernel, args, config, plan=plan, index=index, keys=keys,
                        versions=versions)
        for i in sorted(plan.written):
            self._preserve(launch, i)
        try:
            result = kernel.forward(*args) if config is None else \
                kernel.forward(config, *args)
        finally:
            for key in {keys[i] for i in plan.written if keys[i] is not None}:
                self._arrays[key].version += 1
        self._register(launch)
        return result

    def _track(self, plan, index, i, a):
        key = _key(a)
        if key in self._arrays:
            return key
        for other in self._arrays.values():
            if _overlaps(a, other.array):
                raise DifferentiationError(
                    f"Launch #{index} of kernel '{plan.kernel_name}' passes argument "
                    f"'{plan.arg_names[i]}' ({_describe(a)}), which overlaps in memory "
                    f"an array the tape has already seen ({_describe(other.array)}) "
                    "without being the same view of it. The tape tracks arrays by "
                    "their exact memory view: pass the same array (or an identical "
                    "view) every time, or copy the view before the launch.")
        self._arrays[key] = _TrackedArray(a)
        return key

    def _preserve(self, launch, i):
        """Keep the pre-call contents of written argument ``i`` if anyone needs them."""
        key = launch.keys[i]
        if key is None:
            return
        tracked = self._arrays[key]
        version = tracked.version
        if version in tracked.snapshots:
            return
        needs = list(tracked.readers.get(version, ()))
        if i in launch.plan.read:
            needs.append(_Reader(launch.index, i))
        if not needs:
            return
        if not self.copy_inputs:
            raise self._overwrite_error(launch, i, needs[0])
        tracked.snapshots[version] = _copy(tracked.array)

    def _overwrite_error(self, launch, i, reader):
        what = f"argument '{launch.arg_name(i)}' ({_describe(launch.args[i])})"
        if reader.launch == launch.index:
            head = (f"{_sentence(launch.describe())} reads and overwrites {what} "
                    "in place, and its adjoint needs the contents from before the "
                    "call.")
        else:
            earlier = self._launches[reader.launch]
            head = (f"{_sentence(launch.describe())} would overwrite {what}, which "
                    f"{earlier.describe()} read as argument "
                    f"'{earlier.arg_name(reader.arg)}' and needs for its adjoint.")
        return DifferentiationError(
            head + " The tape was created with copy_inputs=False, so it keeps no "
            "copies: use kadj.Tape() to let it copy, or write into a different array.")

    def _register(self, launch):
        plan = launch.plan
        for i in plan.read:
            key = launch.keys[i]
            if key is not None:
                readers = self._arrays[key].readers
                readers.setdefault(launch.versions[i], []).append(
                    _Reader(launch.index, i))
        for i in plan.adjoint_args:
            if launch.keys[i] is not None:
                self._differentiable.add(launch.keys[i])
        self._launches.append(launch)

    # --------------------------------------------------------------- backward

    def backward(self, loss=None, *, seeds=None):
        """Replay the recorded adjoints in reverse and accumulate the gradients.

        ``loss`` is a recorded 1-element floating-point array, seeded with 1.0;
        ``seeds`` is a list of ``(array, cotangent)`` pairs, each cotangent the
        shape of its array.  Gradients add up over calls until :meth:`zero`.
        """
        if not self._launches:
            raise DifferentiationError(
                "The tape has recorded no launches; call kernels inside "
                "'with tape:' before calling tape.backward().")
        seeded = {}
        for key, cotangent in self._seeds(loss, seeds):
            array = self._arrays[key].array
            seeded.setdefault(key, np.zeros(tuple(array.shape), np.dtype(array.dtype)))
            seeded[key] += cotangent
        buffers = {key: _from_host(self._arrays[key].array, host)
                   for key, host in seeded.items()}
        scalars = {}
        for launch in reversed(self._launches):
            self._replay(launch, buffers, scalars)
        for key, buffer in buffers.items():
            host = _to_host(buffer)
            if key in self._grads:
                self._grads[key] = self._grads[key] + host
            else:
                self._grads[key] = host
        for slot, buffer in scalars.items():
            self._scalar_grads[slot] = self._scalar_grads.get(slot, 0.0) + buffer[0]
        self._has_gradients = True

    def _seeds(self, loss, seeds):
        if loss is None and seeds is None:
            raise DifferentiationError(
                "tape.backward() needs something to differentiate: pass a 1-element "
                "loss array, or seeds=[(array, cotangent), ...].")
        pairs = []
        if loss is not None:
            self._recorded_float_key(loss, "the loss")
            if int(np.prod(loss.shape)) != 1:
                raise DifferentiationError(
                    f"tape.backward(loss) needs a 1-element loss array, but got an "
                    f"array of shape {tuple(loss.shape)}; pass seeds=[(array, "
                    "cotangent)] to seed a larger output.")
            pairs.append((loss, np.ones(tuple(loss.shape), np.dtype(loss.dtype))))
        for pair in seeds or ():
            if len(pair) != 2:
                raise DifferentiationError(
                    "Each seed must be an (array, cotangent) pair.")
            array, cotangent = pair
            self._recorded_float_key(array, "a seeded array")
            cotangent = _to_host(cotangent) if _is_array(cotangent) else \
                np.asarray(cotangent)
            if tuple(cotangent.shape) != tuple(array.shape):
                raise DifferentiationError(
                    f"A seed's cotangent has shape {cotangent.shape}, but its array "
                    f"has shape {array.shape}; they must match.")
            pairs.append((array, cotangent.astype(array.dtype)))
        return [(_key(a), ct) for a, ct in pairs]

    def _recorded_float_key(self, array, what):
        if not _is_array(array) or _key(array) not in self._arrays:
            raise DifferentiationError(
                f"The tape never saw {what} ({_describe(array)}): seed only arrays "
                "that recorded launches wrote or read (the same array object or an "
                "identical view).")
        if np.dtype(array.dtype).kind != "f":
            raise DifferentiationError(
                f"{_sentence(what)} has dtype {array.dtype}; only floating-point "
                "arrays can be seeded.")

    def _replay(self, launch, buffers, scalars):
        plan = launch.plan
        args = tuple(self._pre_call(launch, i) for i in range(len(launch.args)))
        adjoints, extra, seen = [], [], set()
        for i in plan.adjoint_args:
            key = launch.keys[i]
            if key is None:
                buffer = np.zeros(1, dtype=np.asarray(launch.args[i]).dtype)
                scalars[(launch.index, i)] = buffer
            elif key in seen:
                # the same read-only array passed twice: its own buffer, added after
                buffer = _zeros_like(buffers[key])
                extra.append((key, buffer))
            else:
                seen.add(key)
                buffer = buffers.get(key)
                if buffer is None:
                    buffer = buffers[key] = _zeros_like(self._arrays[key].array)
            adjoints.append(buffer)
        kwargs = {"adj_return": 0.0} if plan.returns_value else {}
        if launch.config is None:
            launch.kernel.adjoint(*args, *adjoints, **kwargs)
        else:
            launch.kernel.adjoint[launch.config](*args, *adjoints)
        for key, buffer in extra:
            buffers[key] = _from_host(buffers[key],
                                      _to_host(buffers[key]) + _to_host(buffer))

    def _pre_call(self, launch, i):
        key = launch.keys[i]
        if key is None:
            return launch.args[i]
        tracked = self._arrays[key]
        contents = tracked.contents(launch.versions[i])
        if contents is not None:
            return contents
        if i not in launch.plan.read:
            return tracked.array  # the adjoint does not read it; any contents do
        raise InternalError(
            f"the tape lost the pre-call contents of argument '{launch.arg_name(i)}' "
            f"of {launch.describe()}")

    # -------------------------------------------------------------- gradients

    def grad(self, x):
        """The gradient with respect to ``x``'s contents before the tape first saw it.

        Same shape and dtype as ``x``; a copy, so changing it does not change the tape.
        """
        if not _is_array(x) or _key(x) not in self._arrays:
            raise DifferentiationError(
                f"The tape never saw this array ({_describe(x)}); ask for the "
                "gradient of an array that recorded launches wrote or read (the same "
                "array object or an identical view).")
        if not self._has_gradients:
            raise DifferentiationError(
                "The tape has no gradients yet; call tape.backward(...) before "
                "tape.grad(...).")
        key = _key(x)
        if key not in self._differentiable and key not in self._grads:
            raise DifferentiationError(
                f"No recorded launch differentiates with respect to this array "
                f"({_describe(x)}): it is not floating point, or every kernel that "
                "reads it excludes it with wrt=.")
        g = self._grads.get(key)
        shape = tuple(x.shape)
        g = np.zeros(shape, np.dtype(x.dtype)) if g is None else g.reshape(shape).copy()
        return _from_host(x, g)

    def scalar_grads(self):
        """Gradients with respect to each launch's floating-point scalar arguments."""
        if not self._has_gradients:
            raise DifferentiationError(
                "The tape has no gradients yet; call tape.backward(...) before "
                "tape.scalar_grads().")
        return tuple(
            ScalarGrad(index, self._launches[index].plan.kernel_name,
                       self._launches[index].arg_name(i), float(value))
            for (index, i), value in sorted(self._scalar_grads.items()))

    def zero(self):
        """Clear the gradients; the recorded launches stay."""
        self._grads = {}
        self._scalar_grads = {}

    def reset(self):
        """Forget the recorded launches, the arrays' copies and the gradients."""
        self._launches = []
        self._arrays = {}
        self._differentiable = set()
        self._has_gradients = False
        self.zero()


# ------------------------------------------------------------------- arrays


def _is_array(a):
    return isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__") or \
        hasattr(a, "copy_to_host")


def _device_pointer(a):
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["data"][0]
    host = getattr(a, "_ary", None)  # the CUDA simulator's device arrays wrap one
    if isinstance(host, np.ndarray):
        return host.__array_interface__["data"][0]
    raise TypeError(f"cannot locate the memory of {type(a).__name__}")


def _key(a):
    """An array's exact memory view: equal keys mean the same elements."""
    if isinstance(a, np.ndarray):
        return ("host", a.__array_interface__["data"][0], a.shape, a.strides,
                a.dtype.str)
    return ("device", _device_pointer(a), tuple(a.shape), tuple(a.strides),
            np.dtype(a.dtype).str)


def _span(key):
    _, ptr, shape, strides, dt = key
    lo = hi = ptr
    for n, st in zip(shape, strides):
        if n == 0:
            return ptr, ptr
        lo += min(0, (n - 1) * st)
        hi += max(0, (n - 1) * st)
    return lo, hi + np.dtype(dt).itemsize


def _overlaps(a, b):
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if not np.may_share_memory(a, b):
            return False
        try:
            return bool(np.shares_memory(a, b, max_work=100_000))
        except np.exceptions.TooHardError:
            return True
    ka, kb = _key(a), _key(b)
    if ka[0] != kb[0]:
        return False
    (alo, ahi), (blo, bhi) = _span(ka), _span(kb)
    return alo < bhi and blo < ahi


# ---- device arrays (numba's, the simulator's, CuPy's) next to NumPy ones ----------
def _is_cupy(a):
    return type(a).__module__.split(".")[0] == "cupy"


def _copy(a):
    if isinstance(a, np.ndarray):
        return a.copy(order="K")
    if _is_cupy(a):
        return a.copy()
    from numba import cuda
    out = cuda.device_array_like(a)
    out.copy_to_device(a)
    return out


def _to_host(a):
    if isinstance(a, np.ndarray):
        return a
    if _is_cupy(a):
        return a.get()
    return a.copy_to_host()


def _from_host(like, host):
    """``host`` (a NumPy array) on the device that holds ``like``."""
    if isinstance(like, np.ndarray):
        return host
    if _is_cupy(like):
        import cupy
        return cupy.asarray(host)
    from numba import cuda
    return cuda.to_device(np.ascontiguousarray(host))


def _zeros_like(a):
    return _from_host(a, np.zeros(tuple(a.shape), np.dtype(a.dtype)))


def _sentence(text):
    return text[:1].upper() + text[1:]


def _describe(a):
    if isinstance(a, np.ndarray):
        return f"array of shape {a.shape} and dtype {a.dtype}"
    if _is_array(a):
        return (f"{type(a).__name__} of shape {tuple(a.shape)} and dtype "
                f"{np.dtype(a.dtype)}")
    return type(a).__name__


def _holds_array(a):
    if isinstance(a, (tuple, list)):
        return any(_holds_array(x) for x in a)
    return _is_array(a)


def _check_value(plan, index, i, a):
    """Refuse a non-array argument that holds arrays the tape could not track."""
    if _holds_array(a):
        raise DifferentiationError(
            f"The tape cannot record launch #{index} of kernel '{plan.kernel_name}': "
            f"argument '{plan.arg_names[i]}' is a {type(a).__name__} holding arrays, "
            "which the tape cannot track. Pass the arrays as separate arguments.")
    return None


def _check_aliasing(plan, index, keys):
    """Refuse one launch passing the same array twice when it writes it."""
    for i in plan.written:
        for j, key in enumerate(keys):
            if j != i and key is not None and key == keys[i]:
                raise DifferentiationError(
                    f"Launch #{index} of kernel '{plan.kernel_name}' passes the same "
                    f"array as arguments '{plan.arg_names[min(i, j)]}' and "
                    f"'{plan.arg_names[max(i, j)]}' and writes it; the adjoint "
                    "assumes written arrays are distinct from the other arguments. "
                    "Pass a copy for one of them.")
