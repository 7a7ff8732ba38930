"""The quantization of a captured step on one device: the GEMM format each linear leaf runs.

A :class:`QuantPlan` joins a model's :class:`~perfcast.models.quantization.Quantization` (which
layers are stored in which scheme) with the device's matrix types (``native``): a scheme whose
activations the device multiplies natively runs its narrow kernel (FP8 × FP8 on Hopper, FP4 × FP4
on Blackwell); any other runs its weight-only kernel, the weights widened to the model dtype inside
the GEMM (NVFP4 on an H100 through vLLM's Marlin NVFP4 GEMM, FP8 on an A100 through FP8 Marlin).
The lowering asks it for each matmul and grouped-GEMM record (:meth:`QuantPlan.format`) and sets
the leaf's operand dtypes, ``compute_dtype`` (the matrix rate) and ``quant_format`` (the kernel
class and table key) from the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.capture.types import Capture, OpRecord
from perfcast.ir import DTYPES
from perfcast.ir.dtypes import element
from perfcast.models.quantization import GROUPS, Quantization, Scheme, from_flag, group_of


@dataclass(frozen=True)
class LeafFormat:
    """How one linear runs: ``kernel`` the GEMM format, ``native`` whether it multiplies in the
    narrow types, the weight and activation dtypes the kernel reads, ``compute`` its rate's dtype."""

    group: str
    scheme: Scheme
    kernel: str
    native: bool
    weight: str
    activation: str
    compute: str

    @property
    def path(self) -> str:
        if self.native:
            return f"{element(self.weight)} × {element(self.activation)} ({self.kernel}, activations {self.activation})"
        return f"weight-only: {element(self.weight)} weights dequantized inside the GEMM, {self.activation} math ({self.kernel})"


@dataclass(frozen=True)
class QuantPlan:
    quantization: Quantization
    native: frozenset[str]  # dtypes the device's matrix units multiply
    model_dtype: str = "bf16"
    engine: str | None = None  # the engine profile's framework: some pick their own kernel for a format
    options: tuple[tuple[str, str], ...] = ()  # the engine's option values (name, value) that can pick one

    def format(self, module: str, group: str) -> LeafFormat | None:
        s = self.quantization.scheme(module, group)
        if s is None:
            return None
        kernel, act = s.execution(self.native, self.engine, group, self.options)
        return LeafFormat(group, s, kernel, act is not None, s.weight, act or self.model_dtype,
                          element(act or self.model_dtype))


def as_plan(quantize, model_dtype: str) -> QuantPlan | None:
    """A lowering's quantization: a plan, or a ``--quantize`` text (then every activation type
    counts as native: the plan of a device that multiplies them all)."""
    if quantize is None or isinstance(quantize, QuantPlan):
        return quantize
    q = from_flag(str(quantize))
    return QuantPlan(q, frozenset(DTYPES), model_dtype) if q.quantized else None


def record_group(rec: OpRecord, kind: str) -> str:
    return group_of(rec.module or "", experts=kind == "grouped_matmul")


def param_module(name: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` → its module; stacked expert tensors
    (``…mlp.experts.gate_up_proj``) belong to the experts module."""
    return name.rsplit(".", 1)[0]


def param_format(plan: QuantPlan | None, capture: Capture, name: str) -> LeafFormat | None:
    """The format a parameter is stored in (None: the model dtype): matmul weights only."""
    if plan is None or name not in capture.linear_params:
        return None
    meta = capture.params[name]
    return plan.format(param_module(name), group_of(param_module(name), experts=len(meta.shape) == 3))


def summary(plan: QuantPlan | None, capture: Capture, model_dtype: str) -> list[dict]:
    """Per module group, each distinct way its linears run in the captured step: the scheme, the
    dtypes, the kernel format and path, and the modules (the representative layer's)."""
    rows: dict[tuple, dict] = {}
    for rec in capture.records:
        packet = rec.op.split(".")[1] if "." in rec.op else rec.op
        kind = "grouped_matmul" if packet == "moe_experts" else "matmul" if packet in ("mm", "addmm", "bmm", "baddbmm") else None
        if kind is None or not any(t.is_param and len(t.shape) >= 2 for t in rec.inputs):
            continue
        group = record_group(rec, kind)
        f = plan.format(rec.module, group) if plan is not None else None
        key = (group, f)
        row = rows.setdefault(key, {
            "group": group, "scheme": f.scheme.name if f else model_dtype,
            "detail": f.scheme.detail if f else f"unquantized ({model_dtype})",
            "weight_dtype": f.weight if f else model_dtype, "activation_dtype": f.activation if f else model_dtype,
            "kernel_format": f.kernel if f else model_dtype,
            "path": f.path if f else f"{model_dtype} GEMM", "modules": []})
        if rec.module not in row["modules"]:
            row["modules"].append(rec.module)
    order = {g: i for i, g in enumerate(GROUPS)}
    return sorted(rows.values(), key=lambda r: order.get(r["group"], len(order)))
