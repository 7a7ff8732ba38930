"""Front-end B: capture of real Hugging Face models on fake tensors, and lowering to the IR.
Importing this package imports torch; commands that need no capture never import it."""

from perfcast.capture.build import Capture, LayerGroup, capture, hf_config
from perfcast.capture.lower import FREE, QUANTIZATION, Lowered, lower, op_packet

__all__ = ["Capture", "LayerGroup", "capture", "hf_config", "FREE", "QUANTIZATION", "Lowered",
           "lower", "op_packet"]
