"""The analysis result (:class:`Facts`, frozen), its memory-policy input
(:class:`MemoryPolicy`) and the private working record the analyses fill in.

:func:`kadj.analysis.analyze` builds a :class:`_Work` (mutable: the fixpoints add to
its sets and dicts) and returns :func:`freeze` of it: every set becomes a
``frozenset``, every dict a read-only ``MappingProxyType`` whose values are tuples or
frozensets.  Nothing can change the facts after ``analyze`` returns.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping

from numba.core import types

from .. import ir


@dataclass(frozen=True)
class MemoryPolicy:
    """How the target treats memory, as far as the analysis must know.

    ``carried_replay``: loops whose iterations carry state are replayed too, each
    reversed iteration starting from that state restored from a checkpoint (a target
    whose tape is bounded per thread).  ``private_scratch``: scratch arrays private to a
    thread; ``shared_scratch``: scratch arrays shared by the threads of a block;
    ``owned_shared``: shared arrays each thread writes only at its own element;
    ``unwritten``: arrays the adjoint never writes."""

    carried_replay: bool = False
    private_scratch: frozenset = frozenset()
    unwritten: frozenset = frozenset()
    shared_scratch: frozenset = frozenset()
    owned_shared: frozenset = frozenset()

    def __post_init__(self):
        for name in ("private_scratch", "unwritten", "shared_scratch", "owned_shared"):
            object.__setattr__(self, name, frozenset(getattr(self, name)))
        object.__setattr__(self, "carried_replay", bool(self.carried_replay))


class _Queries:
    def is_float(self, name):
        return isinstance(self.kernel.types.get(name), (types.Float, types.Complex))

    def active(self, x):
        return isinstance(x, ir.Var) and x.name in self.varied


@dataclass(frozen=True, eq=False)
class Facts(_Queries):
    """What the reverse pass needs to know about a kernel.  Loops are keyed by their
    ``uid``; ``has_rev`` and ``replay_fresh`` by ``id()`` of a statement of
    ``kernel.body``."""

    kernel: ir.Kernel
    slot_args: tuple                 # argument names with adjoint slots
    policy: MemoryPolicy
    varied: frozenset                # varied float scalar variables
    varied_arrays: frozenset         # arrays with adjoint arrays
    param_arrays: frozenset
    scratch_arrays: frozenset
    loaded: frozenset
    stored: frozenset
    work_arrays: frozenset           # params read and written (the adjoint copies them)
    assign_count: Mapping            # variable -> number of assignments
    in_loop: frozenset               # variables assigned inside a loop
    recompute: Mapping               # loop uid -> tuple of stmts recomputed
    recompute_vars: Mapping          # loop uid -> frozenset of vars they define
    needed: frozenset                # variables the reverse sweep reads
    pushed: frozenset                # ... of those, the ones recorded on the tape
    restore_arrays: frozenset        # arrays whose overwritten elements are recorded
    has_rev: Mapping                 # id(stmt) -> bool: has reverse code
    index_saved: frozenset           # loop uids whose index is saved
    ascending: frozenset             # loops reversible in forward order
    replay: Mapping                  # loop uid -> vars saved around it (replayed loops)
    loop_saved: Mapping              # loop uid -> vars saved once around it
    loop_unsaved: Mapping            # loop uid -> vars it does not record, nor save
    replay_fresh: frozenset          # ids of first defs in replayed loops
    checkpoint: Mapping              # loop uid -> carried vars checkpointed
    checkpoint_owned: Mapping        # loop uid -> owned shared arrays checkpointed
    force_replay: frozenset          # loops replayed for their arrays
    replay_shared: Mapping           # loop uid -> shared arrays rewritten by a replay
    checkpoint_arrays: Mapping       # loop uid -> scratch arrays checkpointed

    def unrecorded(self, uid):
        """The variables loop ``uid``'s iterations do not record: saved once around
        the loop (``loop_saved``), or not at all (``loop_unsaved``: no reverse reads
        their value on entry to the loop)."""
        return tuple(self.loop_saved.get(uid, ())) + tuple(self.loop_unsaved.get(uid, ()))

    # the policy's fields, read where they were read before the policy was a record
    @property
    def carried_replay(self):
        return self.policy.carried_replay

    @property
    def private_scratch(self):
        return self.policy.private_scratch

    @property
    def unwritten(self):
        return self.policy.unwritten

    @property
    def shared_scratch(self):
        return self.policy.shared_scratch

    @property
    def owned_shared(self):
        return self.policy.owned_shared


@dataclass(eq=False)
class _Work(_Queries):
    """The mutable record the analyses fill in (private to :mod:`kadj.analysis`)."""

    kernel: ir.Kernel
    slot_args: tuple
    policy: MemoryPolicy
    varied: set = field(default_factory=set)
    varied_arrays: set = field(default_factory=set)
    param_arrays: set = field(default_factory=set)
    scratch_arrays: set = field(default_factory=set)
    loaded: set = field(default_factory=set)
    stored: set = field(default_factory=set)
    work_arrays: set = field(default_factory=set)
    assign_count: dict = field(default_factory=dict)
    in_loop: set = field(default_factory=set)
    recompute: dict = field(default_factory=dict)
    recompute_vars: dict = field(default_factory=dict)
    needed: set = field(default_factory=set)
    pushed: set = field(default_factory=set)
    restore_arrays: set = field(default_factory=set)
    has_rev: dict = field(default_factory=dict)
    index_saved: set = field(default_factory=set)
    ascending: set = field(default_factory=set)
    replay: dict = field(default_factory=dict)
    loop_saved: dict = field(default_factory=dict)
    loop_unsaved: dict = field(default_factory=dict)
    replay_fresh: set = field(default_factory=set)
    checkpoint: dict = field(default_factory=dict)
    checkpoint_owned: dict = field(default_factory=dict)
    force_replay: set = field(default_factory=set)
    replay_shared: dict = field(default_factory=dict)
    checkpoint_arrays: dict = field(default_factory=dict)
    # shared tiles a replay pass relied on being rewritten by an enclosing replayed
    # loop: those loops join force_replay in analyze's fixpoint
    tile_owners: set = field(default_factory=set)
    # scratch arrays each iteration of a loop rewrites whole (analysis.rewrites) ->
    # that loop, which replays them instead of restoring them; those whose loop could
    # not be replayed after all are restored (``scratch_kept``)
    scratch_owner: dict = field(default_factory=dict)
    scratch_kept: set = field(default_factory=set)

    carried_replay = Facts.carried_replay
    private_scratch = Facts.private_scratch
    unwritten = Facts.unwritten
    shared_scratch = Facts.shared_scratch
    owned_shared = Facts.owned_shared


def _frozen(v: Any):
    if isinstance(v, (set, frozenset)):
        return frozenset(v)
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, dict):
        return MappingProxyType({k: _frozen(x) for k, x in v.items()})
    return v


def freeze(w: _Work) -> Facts:
    return Facts(**{f.name: _frozen(getattr(w, f.name)) for f in fields(Facts)})
