"""The CUDA part of reversing loops from checkpoints (:mod:`kadj.checkpoint_reverse`).

Besides the loop's carried scalars and the thread's local scratch arrays, a CUDA
thread checkpoints its own element of the shared arrays the loop rewrites (analysis
``owned_shared``); the block meets at a barrier around restoring them, since other
threads read them.  Replayed iterations execute their stores into local arrays and into
the shared tiles the loop rewrites.  Slots are ``cuda.local.array`` s (the writer's
``local_array``).
"""
from __future__ import annotations

from .. import adj_ir as A
from .. import ir


class SharedCheckpoints:
    """Hooks of :class:`kadj.checkpoint_reverse.CheckpointedLoops` for shared memory."""

    def replay_store(self, s):
        return self.space.get(s.array.name) == "local" or \
            s.array.name in self._replay_shared

    def _owned(self, s):
        """(array, element text, bounds condition, dtype) of the shared arrays whose
        own element each thread checkpoints for loop ``s`` (analysis.owned_shared)."""
        out = []
        for name in self.a.checkpoint_owned.get(s.uid, ()):
            key = None
            for x in ir.walk(self.k.body):
                if isinstance(x, ir.Store) and x.array.name == name:
                    key = self.index.owned_key(x.index, self.index.local,
                                               self.index.block_ndim)
                    break
            parts = [v if kind == "c" else str(v) for kind, v in key]
            conds = [f"{v} < {self.n(name)}.shape[{k}]"
                     for k, (kind, v) in enumerate(key) if kind == "c"]
            elem = f"{self.n(name)}[{', '.join(parts)}]"
            out.append((name, elem, " and ".join(conds) or "True",
                        self.T[name].dtype))
        return out

    def _owned_report(self, owned):
        return [f"{elem} (each thread its own)" for _, elem, _, _ in owned]

    def _push_owned(self, s, depth):
        for name, elem, cond, dt in self._owned(s):
            kind = self.tape_of(dt)
            self.put(depth, A.Push(kind, f"{elem} if {cond} else {self.zero(dt)}",
                                   once=True))

    def _pop_owned(self, s, depth):
        owned = self._owned(s)
        if owned:
            self.put(depth, A.Barrier("nobody reads the shared state now"))
        for name, elem, cond, dt in reversed(owned):
            kind = self.tape_of(dt)
            self.put(depth, A.Pop(kind, elem, cond=cond))
        if owned:
            self.put(depth, A.Barrier("every thread restored its element"))

    def _save_owned(self, depth, slot, owned, ck_own):
        for name, elem, cond, dt in owned:  # each thread its own shared element
            self.put(depth, A.If(cond))
            self.put(depth + 1, A.Assign(f"{ck_own[name]}[{slot}]", elem))

    def _load_owned(self, depth, slot, owned, ck_own):
        if owned:
            self.put(depth, A.Barrier("nobody reads the shared state now"))
        for name, elem, cond, dt in owned:
            self.put(depth, A.If(cond))
            self.put(depth + 1, A.Assign(elem, f"{ck_own[name]}[{slot}]"))
        if owned:
            self.put(depth, A.Barrier("every thread restored its element"))
