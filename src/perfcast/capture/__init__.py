"""Front-end B: capture of real Hugging Face models on fake tensors, and lowering to the IR.

The capture itself (:func:`capture`, :func:`hf_config`) needs torch and transformers and is
imported on first use; the capture data, the lowering and the capture cache do not, so a cached
capture is lowered and priced by a process that never imports torch.
"""

from perfcast.capture.lower import FREE, Lowered, lower, op_packet
from perfcast.capture.quant import QuantPlan
from perfcast.capture.types import Capture, LayerGroup, OpRecord, TensorMeta

__all__ = ["Capture", "LayerGroup", "OpRecord", "TensorMeta", "capture", "hf_config", "FREE",
           "QuantPlan", "Lowered", "lower", "op_packet"]


def __getattr__(name):
    if name in ("capture", "hf_config"):
        from perfcast.capture import build

        return getattr(build, name)
    raise AttributeError(f"module 'perfcast.capture' has no attribute {name!r}")
