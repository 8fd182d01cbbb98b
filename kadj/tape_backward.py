"""The backward of a :class:`kadj.Tape`: seed, replay the recorded adjoints in reverse
over one adjoint buffer per array, accumulate the gradients.

Each adjoint runs on its launch's pre-call arguments (a kept copy, or the live array
when it still holds that version) with the tape's own buffers: zeroed arrays of each
argument's shape and dtype, where the argument lives.  A CPU launch of a
:class:`kadj.kernel.DifferentiatedKernel` calls the compiled adjoint directly: the
checks ``kernel.adjoint(...)`` makes of user-supplied buffers (shapes, dtypes,
writeable, no shared memory) hold by construction for the tape's buffers, and the
forward arguments were checked when the launch was recorded (distinct tracked arrays
never overlap; an array passed twice is never written).  The one check that does not
hold by construction, a written argument whose elements share memory (a broadcast
view), sends the call through ``kernel.adjoint``, which refuses it.
"""
from __future__ import annotations


import numpy as np

from . import arrays
from .errors import DifferentiationError, InternalError
from .tape_versions import sentence

__all__ = ["Backward"]


class Backward:
    """The backward of :class:`kadj.Tape` (a part of the class)."""

    def _backward(self, loss, seeds):
        if not self._launches:
            raise DifferentiationError(
                "The tape has recorded no launches; call kernels inside "
                "'with tape:' before calling tape.backward().")
        self._check_fingerprints()
        seeded = {}
        for key, cotangent in self._seeds(loss, seeds):
            array = self._arrays[key].array
            seeded.setdefault(key, np.zeros(tuple(array.shape), np.dtype(array.dtype)))
            seeded[key] += cotangent
        buffers = {key: arrays.like(self._arrays[key].array, host)
                   for key, host in seeded.items()}
        scalars = {}
        for launch in reversed(self._launches):
            self._replay(launch, buffers, scalars)
        for key, buffer in buffers.items():
            host = arrays.to_host(buffer)
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
            cotangent = arrays.to_host(cotangent) if arrays.is_array(cotangent) else \
                np.asarray(cotangent)
            if tuple(cotangent.shape) != tuple(array.shape):
                raise DifferentiationError(
                    f"A seed's cotangent has shape {cotangent.shape}, but its array "
                    f"has shape {array.shape}; they must match.")
            pairs.append((array, cotangent.astype(array.dtype)))
        return [(arrays.memory_key(a), ct) for a, ct in pairs]

    def _recorded_float_key(self, array, what):
        if not arrays.is_array(array) or arrays.memory_key(array) not in self._arrays:
            raise DifferentiationError(
                f"The tape never saw {what} ({arrays.describe(array)}): seed only arrays "
                "that recorded launches wrote or read (the same array object or an "
                "identical view).")
        if np.dtype(array.dtype).kind != "f":
            raise DifferentiationError(
                f"{sentence(what)} has dtype {array.dtype}; only floating-point "
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
                buffer = arrays.zeros_like(buffers[key])
                extra.append((key, buffer))
            else:
                seen.add(key)
                buffer = buffers.get(key)
                if buffer is None:
                    buffer = buffers[key] = arrays.zeros_like(self._arrays[key].array)
            adjoints.append(buffer)
        if launch.config is not None:
            launch.kernel.adjoint[launch.config](*args, *adjoints)
        elif not _trusted_call(launch, args, adjoints):
            kwargs = {"adj_return": 0.0} if plan.returns_value else {}
            launch.kernel.adjoint(*args, *adjoints, **kwargs)
        for key, buffer in extra:
            arrays.add_into(buffers[key], buffer)

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


def _trusted_call(launch, args, adjoints):
    """Run a launch's adjoint through the kernel's ``adjoint_trusted`` (buffers the tape
    made need none of ``adjoint``'s argument checks); False when the kernel has none or
    declines, and ``kernel.adjoint`` must run it."""
    trusted = getattr(launch.kernel, "adjoint_trusted", None)
    return trusted is not None and trusted(launch.plan, args, adjoints)
