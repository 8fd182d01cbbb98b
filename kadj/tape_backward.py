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

``backward(wrt=[...])`` replays only the launches :func:`kadj.tape_graph.needed` keeps
and keeps only the requested gradients.  Tapes of CUDA launches replay through
:mod:`kadj.tape_streams` (on the device, on one or several streams).  Gradients stay
where their arrays live: device buffers are added into on the device across calls,
and scalar adjoints of device launches are read back only by ``tape.scalar_grads()``.
The buffers of numba device arrays come from :mod:`kadj.buffer_pool` (CuPy's from
CuPy's memory pool): those kept as gradients return to it on ``tape.zero()``,
``tape.reset()`` or when the tape is collected, the others when the backward ends.
"""
from __future__ import annotations


import numpy as np

from . import arrays, tape_graph, tape_report, tape_streams
from .errors import DifferentiationError, InternalError
from .tape_versions import sentence

__all__ = ["Backward", "before_backward", "stream_count"]

#: callables ``hook(tape)`` run first in every ``Tape.backward`` (:mod:`kadj.mpi` checks
#: there that every rank replays the same communication)
before_backward = []


class Backward:
    """The backward of :class:`kadj.Tape` (a part of the class)."""

    def _backward(self, loss, seeds, wrt=None, streams=None):
        for hook in before_backward:
            hook(self)
        if not self._launches:
            raise DifferentiationError(
                "The tape has recorded no launches; call kernels inside "
                "'with tape:' before calling tape.backward().")
        self._check_fingerprints()
        requested = self._requested_of(wrt)
        buffers = self._seed_buffers(loss, seeds)
        launches = self._launches
        if requested is not None:
            keep = tape_graph.needed(
                launches, requested[0], requested[1], tuple(buffers),
                {key: self._arrays[key].version for key in buffers})
            launches = [launch for launch in launches if launch.index in keep]
        _check_no_cut(launches)
        count = self.streams if streams is None else stream_count(streams)
        scalars = {}
        if any(launch.config is not None for launch in self._launches):
            tape_streams.run(self, launches, buffers, scalars, count,
                             self._barrier())
        else:
            for launch in reversed(launches):
                self._replay(launch, buffers, scalars)
        self._store(buffers, scalars, requested)
        self._finish_checks()

    def _schedule(self, streams, wrt, loss, seeds):
        count = self.streams if streams is None else stream_count(streams)
        launches = self._launches
        requested = self._requested_of(wrt)
        if requested is not None:
            seeded = None
            if loss is not None or seeds is not None:
                seeded = tuple(key for key, _ in self._seeds(loss, seeds))
            keep = tape_graph.needed(
                launches, requested[0], requested[1], seeded,
                {key: t.version for key, t in self._arrays.items()})
            launches = [launch for launch in launches if launch.index in keep]
        return tape_graph.schedule(launches, count, self._barrier())

    # -- what backward(wrt=...) asks for
    def _requested_of(self, wrt):
        """None (every gradient), or (array keys, scalar names) asked for by ``wrt``."""
        if wrt is None:
            return None
        if isinstance(wrt, str) or arrays.is_array(wrt):
            wrt = (wrt,)
        keys, names = set(), set()
        for item in wrt:
            if isinstance(item, str):
                if item not in self._scalar_names():
                    known = ", ".join(sorted(self._scalar_names())) or "none"
                    raise DifferentiationError(
                        f"tape.backward(wrt=...) names the scalar '{item}', but no "
                        "recorded launch has a differentiable scalar argument of that "
                        f"name; the tape's scalar arguments are: {known}.")
                names.add(item)
            elif arrays.is_array(item):
                key = arrays.memory_key(item)
                if key not in self._arrays:
                    raise DifferentiationError(
                        f"tape.backward(wrt=...) lists an array the tape never saw "
                        f"({arrays.describe(item)}); list arrays that recorded launches "
                        "read or wrote (the same array object or an identical view).")
                if key not in self._differentiable:
                    raise DifferentiationError(
                        "tape.backward(wrt=...) lists an array "
                        f"({arrays.describe(item)}) that no recorded launch differentiates with respect to: it is "
                        "not floating point, or every kernel that reads it excludes it "
                        "with wrt=.")
                keys.add(key)
            else:
                raise DifferentiationError(
                    "tape.backward(wrt=...) takes a list of recorded arrays and scalar "
                    f"argument names, but got a {type(item).__name__}.")
        return frozenset(keys), frozenset(names)

    def _scalar_names(self):
        names = set()
        for launch in self._launches:
            plan = launch.plan
            for i in plan.adjoint_args:
                if launch.keys[i] is None:
                    names.add(tape_report.scalar_arg_name(plan.arg_names[i]))
        return names

    def _barrier(self):
        """Which launches run on the host between the streams' work (see
        :mod:`kadj.tape_graph`): opaque entries, and on a tape of CUDA launches also
        CPU launches, custom steps and launches on host arrays."""
        if not any(launch.config is not None for launch in self._launches):
            return tape_graph.is_opaque

        def barrier(launch):
            return tape_graph.is_opaque(launch) or launch.config is None or any(
                arrays.kind(a) == "host" for a in launch.args if arrays.is_array(a))
        return barrier

    # -- seeds
    def _seed_buffers(self, loss, seeds):
        """The adjoint buffers of the seeded arrays, where each array lives."""
        buffers = {}
        host = {}
        for key, cotangent in self._seeds(loss, seeds):
            array = self._arrays[key].array
            if arrays.kind(cotangent) == "host":
                if key in host:
                    host[key] += cotangent
                else:
                    host[key] = np.array(cotangent, dtype=np.dtype(array.dtype),
                                         copy=True)
            elif key in buffers:
                arrays.add_into(buffers[key], cotangent)
            else:
                buffers[key] = arrays.filled(array, cotangent)
        for key, seed in host.items():
            array = self._arrays[key].array
            if arrays.kind(array) != "host":
                seed = arrays.filled(array, seed)   # a pooled buffer on its device
            if key in buffers:
                arrays.add_into(buffers[key], seed)
            else:
                buffers[key] = seed
        return buffers

    def _seeds(self, loss, seeds):
        """(key, cotangent) pairs: a NumPy cotangent, or one of the array's own kind
        and dtype (kept where it lives)."""
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
        if seeds is not None and not isinstance(seeds, (list, tuple)):
            raise DifferentiationError(
                f"tape.backward(seeds=...) takes a list of (array, cotangent) pairs, "
                f"got {arrays.describe(seeds)}; pass seeds=[(y, dy), ...].")
        for n, pair in enumerate(seeds or ()):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                hint = (" (for one seed, pass a list holding one pair: "
                        "seeds=[(y, dy)])" if arrays.is_array(pair) else "")
                raise DifferentiationError(
                    f"Each seed must be an (array, cotangent) pair, but seeds[{n}] is "
                    f"{arrays.describe(pair)}{hint}; pass seeds=[(y, dy), ...].")
            array, cotangent = pair
            self._recorded_float_key(array, "a seeded array")
            if not arrays.is_array(cotangent):
                cotangent = np.asarray(cotangent)
            if tuple(cotangent.shape) != tuple(array.shape):
                raise DifferentiationError(
                    f"A seed's cotangent has shape {tuple(cotangent.shape)}, but its "
                    f"array has shape {tuple(array.shape)}; they must match.")
            same_place = arrays.kind(cotangent) == arrays.kind(array) and \
                np.dtype(cotangent.dtype) == np.dtype(array.dtype)
            if arrays.kind(cotangent) != "host" and not same_place:
                cotangent = arrays.to_host(cotangent)   # another kind, or dtype
            if arrays.kind(cotangent) == "host":
                cotangent = cotangent.astype(array.dtype)
            pairs.append((array, cotangent))
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

    # -- results
    def _store(self, buffers, scalars, requested):
        """Add the backward's buffers into the gradients (where they live; device
        buffers are not brought to the host here)."""
        # the gradients kept are those every backward since zero() computed
        if not self._since_zero or self._requested is None:
            self._requested = requested
        elif requested is not None:
            self._requested = (self._requested[0] & requested[0],
                               self._requested[1] & requested[1])
        self._since_zero = True
        for key, buffer in buffers.items():
            if requested is not None and key not in requested[0]:
                continue
            if key in self._grads:
                arrays.add_into(self._grads[key], buffer)
            else:
                self._grads[key] = buffer
        for slot, buffer in scalars.items():
            if requested is not None:
                launch = self._launches[slot[0]]
                name = tape_report.scalar_arg_name(launch.arg_name(slot[1]))
                if name not in requested[1]:
                    continue
            if arrays.kind(buffer) == "host":
                self._scalar_grads[slot] = self._scalar_grads.get(slot, 0.0) + buffer[0]
            else:
                self._pending_scalars.append((slot, buffer))
        if requested is not None:
            # a requested scalar of a launch that does not lead to the seeds (left out
            # of this backward) has a zero gradient, as in a full backward
            for launch in self._launches:
                for i in launch.plan.adjoint_args:
                    if launch.keys[i] is None and tape_report.scalar_arg_name(
                            launch.arg_name(i)) in requested[1]:
                        zero = 0j if isinstance(launch.args[i], (complex, np.complexfloating)) \
                            else 0.0
                        self._scalar_grads.setdefault((launch.index, i), zero)
        self._has_gradients = True

    def _fold_scalars(self):
        """Bring the device buffers of scalar gradients to the host (on demand, after
        the backward)."""
        pending, self._pending_scalars = self._pending_scalars, []
        for slot, buffer in pending:
            value = arrays.to_host(buffer)[0]
            self._scalar_grads[slot] = self._scalar_grads.get(slot, 0.0) + value

    # -- one adjoint
    def _replay(self, launch, buffers, scalars, stream=None):
        """Run one launch's adjoint over ``buffers``; a CUDA launch on ``stream`` (a
        numba stream; None: the configuration it was recorded with)."""
        plan = launch.plan
        args = self._pre_call_args(launch)
        device = _device_array(launch) if launch.config is not None else None
        adjoints, extra, seen = [], [], set()
        for i in plan.adjoint_args:
            key = launch.keys[i]
            if key is None:
                dtype = np.asarray(launch.args[i]).dtype
                buffer = np.zeros(1, dtype=dtype) if device is None else \
                    arrays.zeros((1,), dtype, device, stream)
                scalars[(launch.index, i)] = buffer
            elif key in seen:
                # the same read-only array passed twice: its own buffer, added after
                buffer = arrays.zeros_like(buffers[key], stream)
                extra.append((key, buffer))
            else:
                seen.add(key)
                buffer = buffers.get(key)
                if buffer is None:
                    buffer = buffers[key] = arrays.zeros_like(self._arrays[key].array,
                                                              stream)
            adjoints.append(buffer)
        if launch.config is not None:
            config = launch.config
            if stream is not None:
                config = (config[0], config[1], stream, *config[3:])
            launch.kernel.adjoint[config](*args, *adjoints)
        elif not _trusted_call(launch, args, adjoints):
            kwargs = {"adj_return": 0.0} if plan.returns_value else {}
            launch.kernel.adjoint(*args, *adjoints, **kwargs)
        for key, buffer in extra:
            arrays.add_into(buffers[key], buffer, stream)

    def _pre_call_args(self, launch):
        """The launch's arguments with each array's pre-call contents
        (:meth:`_pre_call`, inlined for the common cases)."""
        tracked_arrays, values = self._arrays, launch.args
        args = []
        for i, key in enumerate(launch.keys):
            if key is None:
                args.append(values[i])
                continue
            tracked, version = tracked_arrays[key], launch.versions[i]
            if version in tracked.snapshots:
                args.append(tracked.snapshots[version])
            elif version == tracked.version:
                args.append(tracked.array)
            else:
                args.append(self._pre_call(launch, i))
        return tuple(args)

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


def _check_no_cut(launches):
    """Refuse a replay whose chain a ``wrt`` cuts: a launch that reads a floating-point
    array it has no adjoint slot for (its kernel differentiated with a ``wrt`` that
    leaves it out), which an earlier launch of the replay wrote with an adjoint.  The
    gradients of that launch's inputs would miss the path through the array, with no
    error; the user decides (the array into ``wrt``, or a copy passed as a constant)."""
    produced = {}        # (key, version) -> (launch, argument) that wrote it
    for launch in launches:
        plan = launch.plan
        if tape_graph.is_opaque(launch):
            continue
        for i in sorted(plan.read):
            key = launch.keys[i]
            if key is None or i in plan.adjoint_args or \
                    np.dtype(getattr(launch.args[i], "dtype", np.int8)).kind not in "fc":
                continue
            writer = produced.get((key, launch.versions[i]))
            if writer is None:
                continue
            w, j = writer
            name = launch.arg_name(i)
            raise DifferentiationError(
                f"{sentence(launch.describe())} reads argument '{name}', which "
                f"{w.describe()} wrote (as '{w.arg_name(j)}'), but kernel "
                f"'{plan.kernel_name}' has no adjoint for '{name}' (it was "
                "differentiated with a wrt that leaves it out), so the gradients of "
                f"what went into '{name}' would miss this path, with no error. "
                f"Differentiate '{plan.kernel_name}' with '{name}' in wrt (or without "
                f"wrt); to treat '{name}' as a constant here, pass a copy of it to this "
                "launch.")
        for j in plan.written:
            if launch.keys[j] is not None and j in plan.adjoint_args:
                produced[(launch.keys[j], launch.versions[j] + 1)] = (launch, j)


def _trusted_call(launch, args, adjoints):
    """Run a launch's adjoint through the kernel's ``adjoint_trusted`` (buffers the tape
    made need none of ``adjoint``'s argument checks); False when the kernel has none or
    declines, and ``kernel.adjoint`` must run it."""
    trusted = getattr(launch.kernel, "adjoint_trusted", None)
    return trusted is not None and trusted(launch.plan, args, adjoints)


def _device_array(launch):
    """The first array argument of a CUDA launch that lives on a device (scalar
    adjoints go next to it), or None when its arrays are NumPy arrays."""
    for a in launch.args:
        if arrays.is_array(a) and arrays.kind(a) != "host":
            return a
    return None


def stream_count(streams):
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise DifferentiationError(
            f"streams= must be a positive integer (the number of CUDA streams the "
            f"backward may use), not {streams!r}.")
    return streams
