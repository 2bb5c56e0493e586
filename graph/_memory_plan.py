"""Memory planning for a compiled partition: temporaries share buffers when their lives do not
overlap, and an elementwise step writes over an input that dies there.

A temporary lives from the step that first touches it to the step that last reads it. Steps run
in order, so after its last step a temporary's buffer is free for the next one (best fit by
size, growing a free buffer when none is large enough). An eltwise or binary step whose input
temporary ends at that step and has the output's exact layout writes in place: each work-item
reads an element before it writes the same one. On an out-of-order stream the execution tracks
dependencies per buffer, so a reused buffer orders its readers before the next writer.
"""

from __future__ import annotations

import attrs

from ._lowering import Plan

_ELEMENTWISE_KINDS = frozenset({"eltwise", "binary"})
# Arguments an elementwise kernel reads at the index it writes (so they may share dst's buffer).
_SAME_INDEX_ARGS = frozenset({"src", "src0", "src1"})


@attrs.frozen
class MemoryPlan:
    """``buffer_of[slot]``: the temporary buffer a temp slot uses (-1 for ports);
    ``buffer_bytes[b]``: each buffer's size."""

    buffer_of: tuple[int, ...]
    buffer_bytes: tuple[int, ...]
    unplanned_bytes: int
    in_place_steps: int

    @property
    def scratch_bytes(self) -> int:
        return sum(self.buffer_bytes)


def plan_memory(plan: Plan, *, reuse: bool = True) -> MemoryPlan:
    temps = [i for i, slot in enumerate(plan.slots) if slot.role == "temp"]
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, step in enumerate(plan.steps):
        for _, view in step.args:
            if plan.slots[view.slot].role == "temp":
                first.setdefault(view.slot, k)
                last[view.slot] = k
    buffer_of = [-1] * len(plan.slots)
    sizes: list[int] = []
    free: list[int] = []
    in_place = 0
    unplanned = sum(plan.slots[i].nbytes for i in temps)

    def allocate(slot: int) -> int:
        need = max(plan.slots[slot].nbytes, 1)
        if reuse and free:
            fitting = [b for b in free if sizes[b] >= need]
            chosen = min(fitting, key=sizes.__getitem__) if fitting else max(free, key=sizes.__getitem__)
            free.remove(chosen)
            sizes[chosen] = max(sizes[chosen], need)
            return chosen
        sizes.append(need)
        return len(sizes) - 1

    for k, step in enumerate(plan.steps):
        written = step.desc.output_names
        dying = [view for name, view in step.args if name not in written
                 and plan.slots[view.slot].role == "temp" and last.get(view.slot) == k
                 and name in _SAME_INDEX_ARGS]
        for name, view in step.args:
            slot = view.slot
            if plan.slots[slot].role != "temp" or first.get(slot) != k or buffer_of[slot] != -1:
                continue
            donor = None
            if reuse and name in written and getattr(step.desc, "kind", None) in _ELEMENTWISE_KINDS:
                donor = next((d for d in dying if d.desc == view.desc and d.slot != slot), None)
            if donor is not None:
                buffer_of[slot] = buffer_of[donor.slot]
                dying.remove(donor)
                in_place += 1
                last[donor.slot] = -1  # its buffer now belongs to the output
            else:
                buffer_of[slot] = allocate(slot)
        ended = {view.slot for _, view in step.args
                 if plan.slots[view.slot].role == "temp" and last.get(view.slot) == k}
        for slot in ended:
            if reuse and buffer_of[slot] not in free and not any(
                    buffer_of[o] == buffer_of[slot] and last.get(o, -1) > k for o in temps if o != slot):
                free.append(buffer_of[slot])
    for slot in temps:  # a temporary no step touches (cannot happen for a lowered plan)
        if buffer_of[slot] == -1:
            buffer_of[slot] = allocate(slot)
    return MemoryPlan(tuple(buffer_of), tuple(sizes), unplanned, in_place)
