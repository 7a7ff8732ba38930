"""Which quantization a step is priced in, and where it came from.

The checkpoint's own (its config's ``quantization_config``, or ModelOpt's ``hf_quant_config.json``:
:func:`perfcast.models.quant_configs.read`), unless ``--quantize`` overrides it — as a whole
(``--quantize fp8``, ``--quantize none``) or for named module groups (``--quantize
experts=mxfp4``). The KV cache is in ``--kv-cache-dtype``, else the dtype the checkpoint states,
else the model dtype. The device decides each scheme's path (:class:`~perfcast.capture.quant.QuantPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.capture.quant import QuantPlan, param_format, param_module
from perfcast.capture.types import Capture
from perfcast.models import quant_configs
from perfcast.models.quantization import Quantization, from_flag


@dataclass(frozen=True)
class Resolved:
    quantization: Quantization  # the one priced
    checkpoint: Quantization  # the checkpoint's own
    plan: QuantPlan | None
    kv_dtype: str
    kv_source: str
    model_dtype: str = "bf16"

    @property
    def kv_override(self) -> str | None:
        """The KV-cache dtype the lowering sets on attention (None: the model dtype's own)."""
        return self.kv_dtype if self.kv_dtype != self.model_dtype else None

    def as_dict(self, summary: list[dict]) -> dict:
        q = self.quantization
        return {"method": q.method, "source": q.source, "checkpoint": self.checkpoint.method,
                "checkpoint_source": self.checkpoint.source, "groups": summary,
                "kv_cache": {"dtype": self.kv_dtype, "source": self.kv_source}}


def resolve(req) -> Resolved:
    """The quantization of ``req`` (a :class:`~perfcast.inference.textgen.Request`) on its device."""
    ckpt = quant_configs.read(req.model)
    q = ckpt if req.quantize is None else from_flag(req.quantize, base=ckpt)
    native = frozenset(req.device.spec.datasheet.matrix_flops_per_s)
    profile = req.profile()
    options = tuple((name, o.value) for name, o in sorted(profile.options.items()))
    plan = QuantPlan(q, native, req.dtype, profile.framework, options) if q.quantized else None
    if req.kv_dtype is not None:
        kv, source = req.kv_dtype, "--kv-cache-dtype"
    elif ckpt.kv_cache is not None:
        kv, source = ckpt.kv_cache, ckpt.source
    else:
        kv, source = req.dtype, "the model dtype"
    return Resolved(q, ckpt, plan, kv, source, req.dtype)


def notes(res: Resolved, capture: Capture, summary: list[dict]) -> list[str]:
    """The report's lines on quantization: what was priced and from where, each group's path,
    and layers that the checkpoint quantizes differently from the layer that represents them."""
    q = res.quantization
    out = [f"quantization: {q.method} (from {q.source})" if q.quantized else
           f"quantization: none — every linear in the model dtype (from {q.source})"]
    if q is not res.checkpoint and res.checkpoint.quantized:
        out.append(f"the checkpoint's own quantization ({res.checkpoint.method}, {res.checkpoint.source}) "
                   f"is overridden by --quantize")
    for row in summary if q.quantized else ():
        out.append(f"{row['group']}: {row['detail']} — {row['path']} ({len(row['modules'])} module"
                   f"{'s' if len(row['modules']) != 1 else ''}, e.g. {row['modules'][0]})")
    out.append(f"KV cache: {res.kv_dtype} (from {res.kv_source})")
    out.extend(layer_differences(res.plan, capture))
    return out


def layer_differences(plan: QuantPlan | None, capture: Capture) -> list[str]:
    """Decoder layers captured once stand for their whole group; where the checkpoint stores a
    member layer's linears differently from the representative's, the memory counts each layer
    exactly but the step is priced in the representative's formats — said here, never silent."""
    if plan is None:
        return []
    out = []
    for g in capture.groups:
        rep = g.representative
        tag = f".layers.{rep}."
        names = sorted(n for n in capture.linear_params if tag in n)  # one answer whatever the set order
        for i in g.indices[1:]:
            differ = [n for n in names if param_format(plan, capture, n.replace(tag, f".layers.{i}.", 1))
                      != param_format(plan, capture, n)]
            if differ:
                out.append(f"layer {i} stores {param_module(differ[0]).split(tag, 1)[1]} differently from "
                           f"layer {rep}, which prices it (memory counts layer {i} as stored)")
                break
    return out
