"""oneDNN graph documents (the JSON form ``triodnn.graph.from_dict`` reads) built in code, for the
tests of attention graphs forward and backward."""

from __future__ import annotations


def dense_strides(shape) -> list[int]:
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return strides[::-1]


class G:
    """A graph document under construction: ``t`` makes logical tensors, ``op`` ops."""

    def __init__(self):
        self.ops, self.next_id = [], 1000

    def t(self, id_: int, shape, dtype: str = "f32", strides=None) -> dict:
        return {"id": id_, "dtype": dtype, "shape": list(shape), "stride": list(strides or dense_strides(shape)),
                "layout_type": "strided", "property_type": "variable"}

    def op(self, kind: str, inputs, outputs, **attrs) -> None:
        typed = {}
        for name, value in attrs.items():
            kind_ = ("bool" if isinstance(value, bool) else "s64" if isinstance(value, int)
                     else "s64[]" if isinstance(value, list) else "string")
            typed[name] = {"type": kind_, "value": int(value) if isinstance(value, bool) else value}
        self.next_id += 1
        self.ops.append({"id": self.next_id, "name": f"{kind}{self.next_id}", "kind": kind, "attrs": typed,
                         "inputs": inputs, "outputs": outputs})

    def document(self) -> dict:
        produced = {t["id"] for op in self.ops for t in op["outputs"]}
        read = {t["id"] for op in self.ops for t in op["inputs"]}
        inputs = list(dict.fromkeys(t["id"] for op in self.ops for t in op["inputs"] if t["id"] not in produced))
        outputs = [t["id"] for op in self.ops for t in op["outputs"] if t["id"] not in read]
        return {"version": "3.5.0", "engine_kind": "cpu", "fpmath_mode": "strict",
                "input_ports": inputs, "output_ports": outputs, "graph": self.ops}
