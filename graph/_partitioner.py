"""The partitioner: which ops of a graph compile together.

``debug`` gives each op its own partition. ``fusion`` grows partitions along the data flow: an op
joins (and merges) the partitions of its producers when the merged set stays convex, i.e. no
path leaves it and comes back through another partition, which would make the partitions a
cycle. That one rule yields oneDNN's partitions for its fusion patterns (matmul and
convolution post-op chains, scaled-dot-product attention with scale and masks, gated MLP,
binary and eltwise chains, reshape/transpose shuffles): each is a connected group of supported
ops, and oneDNN's pass also reports it as one partition. Unsupported ops each get an
unsupported partition of their own, so a graph always partitions completely.
"""

from __future__ import annotations

from typing import Protocol

from ._logical_tensor import LogicalTensor
from ._lowering import is_supported
from ._op import Op
from ._partition import Partition


class DataFlow(Protocol):
    """What the partitioner reads of a graph: a finalized ``Graph`` is one (the graph calls the
    partitioner, so it is not imported here)."""

    engine_kind: str
    fpmath_mode: str

    @property
    def ops(self) -> list[Op]: ...

    def producer(self, lt_id: int) -> Op | None: ...

    def consumers(self, lt_id: int) -> list[Op]: ...


def partition_graph(graph: DataFlow, policy: str) -> list[Partition]:
    order = [op for op in graph.ops if op.kind != "End"]
    group_of: dict[int, int] = {}          # id(op) -> group key
    members: dict[int, list[Op]] = {}      # group key -> ops
    supported: dict[int, bool] = {}
    next_key = 0

    def producer_groups(op: Op) -> list[int]:
        keys = []
        for lt in op.inputs:
            producer = graph.producer(lt.id)
            if producer is not None and id(producer) in group_of:
                key = group_of[id(producer)]
                if key not in keys:
                    keys.append(key)
        return keys

    def successors(key: int) -> set[int]:
        out = set()
        for op in members[key]:
            for lt in op.outputs:
                for consumer in graph.consumers(lt.id):
                    other = group_of.get(id(consumer))
                    if other is not None and other != key:
                        out.add(other)
        return out

    def convex(keys: list[int], feeding: list[int]) -> bool:
        """No group outside ``keys`` is both reachable from them and reaching them or the new op
        (which ``feeding``, all its producers' groups, feed)."""
        merged = set(keys)
        reach_from = set()
        stack = [s for k in merged for s in successors(k)]
        while stack:
            key = stack.pop()
            if key in reach_from or key in merged:
                continue
            reach_from.add(key)
            stack.extend(successors(key))
        if reach_from & set(feeding):
            return False
        return not any(merged & successors(k) for k in reach_from)

    for op in order:
        ok = is_supported(op)
        feeding = producer_groups(op)
        keys = [k for k in feeding if supported[k]] if ok and policy == "fusion" else []
        if keys and convex(keys, feeding):
            target = keys[0]
            for key in keys[1:]:
                for member in members.pop(key):
                    group_of[id(member)] = target
                    members[target].append(member)
                del supported[key]
        else:
            target = next_key
            next_key += 1
            members[target] = []
            supported[target] = ok
        members[target].append(op)
        group_of[id(op)] = target

    position = {id(op): i for i, op in enumerate(order)}
    groups = _topological_groups(members, successors, position)
    partitions = []
    for pid, key in enumerate(groups):
        ops = sorted(members[key], key=lambda o: position[id(o)])
        partitions.append(_partition(pid, ops, graph, supported[key]))
    return partitions


def _partition(pid: int, ops: list[Op], graph: DataFlow, supported: bool) -> Partition:
    """The partition of ``ops`` (in order), with its ports as ``graph`` connects them."""
    inside = {id(op) for op in ops}
    produced = {lt.id: lt for op in ops for lt in op.outputs}
    inputs: dict[int, LogicalTensor] = {}
    for op in ops:
        for lt in op.inputs:
            if lt.id not in produced:
                inputs.setdefault(lt.id, lt)
    outputs = []
    for lt_id, lt in produced.items():
        consumers = graph.consumers(lt_id)
        # No consumer, an End op (oneDNN's way to mark a graph output), or one outside.
        if not consumers or any(c.kind == "End" or id(c) not in inside for c in consumers):
            outputs.append(lt)
    shared = frozenset(
        lt_id for lt_id in inputs
        if any(id(c) not in inside for c in graph.consumers(lt_id) if c.kind != "End")
        or any(c.kind == "End" for c in graph.consumers(lt_id))
    )
    return Partition(pid, tuple(ops), tuple(inputs.values()), tuple(outputs), supported,
                     graph.engine_kind, graph.fpmath_mode, shared_inputs=shared)


def _topological_groups(members, successors, position) -> list[int]:
    """Group keys in dependency order, ties broken by the earliest op."""
    keys = list(members)
    indegree = {k: 0 for k in keys}
    for k in keys:
        for s in successors(k):
            indegree[s] += 1
    first = {k: min(position[id(op)] for op in members[k]) for k in keys}
    ready = sorted((k for k in keys if indegree[k] == 0), key=first.__getitem__)
    out = []
    while ready:
        k = ready.pop(0)
        out.append(k)
        for s in successors(k):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
        ready.sort(key=first.__getitem__)
    return out
