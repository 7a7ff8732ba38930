"""Reading a checkpoint's quantization: ``quantization_config`` in its config.json, or ModelOpt's
``hf_quant_config.json`` beside it, into a :class:`~perfcast.models.quantization.Quantization`.

One reader per ``quant_method`` (:data:`READERS`): fp8 (transformers FineGrainedFP8 / vLLM Fp8Config),
fbgemm_fp8, mxfp4, compressed-tensors, modelopt, awq, gptq, bitsandbytes. A method perfcast does
not read, or a key with an unexpected value, is one line naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from perfcast.inputs import excerpt, read_json
from perfcast.ir import UserError
from perfcast.models.catalog import ModelConfig, config_folder
from perfcast.models.quantization import (Quantization, Rule, Scheme, fp8, fp8_block, int4, int8,
                                          int8_weight_only, mxfp4, none, nvfp4)

Reader = Callable[[dict, str], Quantization]
READERS: dict[str, Reader] = {}


def reader(*methods: str):
    def add(fn):
        for m in methods:
            if m in READERS:
                raise ValueError(f"quantization reader for {m!r} registered twice")
            READERS[m] = fn
        return fn
    return add


def hf_quant_config_path(model: ModelConfig) -> Path | None:
    """ModelOpt's ``hf_quant_config.json``: beside a config.json given by path, or shipped with
    a catalog entry (``models/configs/hf_quant_config/NAME.json``)."""
    shipped = Path(str(config_folder()))
    if model.path.parent == shipped:
        p = shipped / "hf_quant_config" / f"{model.name}.json"
    else:
        p = model.path.parent / "hf_quant_config.json"
    return p if p.is_file() else None


def read(model: ModelConfig) -> Quantization:
    """The checkpoint's quantization (``none`` when its config states none)."""
    qc = model.data.get("quantization_config")
    if qc is not None:
        where = f"{model.path}: quantization_config"
        if not isinstance(qc, dict):
            raise UserError(f"{where}: expected a mapping, got {type(qc).__name__}")
        method = qc.get("quant_method")
        if method not in READERS:
            raise UserError(f"{where}: key 'quant_method': {excerpt(method)} is not read by perfcast (known: "
                            f"{', '.join(sorted(READERS))}); pass --quantize to price another quantization")
        q = READERS[method](qc, where)
        keep = model.architecture.keep_unquantized
        # transformers' quantizers never convert the model class's _keep_in_fp32_modules
        # (quantizers/base.py get_modules_to_not_convert): the architecture row names them
        return replace(q, rules=q.rules + _kept(list(keep), "hf")) if keep and q.quantized else q
    path = hf_quant_config_path(model)
    if path is None:
        return none("checkpoint unquantized")
    data = read_json(path)
    q = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(q, dict):
        raise UserError(f"{path}: key 'quantization': missing (expected ModelOpt's hf_quant_config.json)")
    return _modelopt_algo(q, f"{path}: quantization")


def _bad(where: str, key: str, expected: str, got) -> UserError:
    return UserError(f"{where}: key '{key}': expected {expected}, got {excerpt(got)}")


def _names(qc: dict, key: str, where: str) -> list[str]:
    v = qc.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(where, key, "a list of module names", v)
    return v


def _int(qc: dict, key: str, where: str, default=None, allowed=None):
    v = qc.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or (allowed is not None and v not in allowed):
        raise _bad(where, key, f"one of {allowed}" if allowed else "an integer", v)
    return v


def _kept(patterns: list[str], syntax: str) -> tuple[Rule, ...]:
    return tuple(Rule(p, None, syntax) for p in patterns)


@reader("fp8")
def _fp8(qc: dict, where: str) -> Quantization:
    """FP8 checkpoints (DeepSeek-V3/R1, Qwen3-FP8): ``weight_block_size`` [n, k] makes them
    block-scaled; without it per-tensor (vLLM model_executor/layers/quantization/fp8.py
    Fp8Config.from_config). ``modules_to_not_convert`` / ``ignored_layers`` stay in the model
    dtype, and so does lm_head (transformers keeps the output embedding:
    quantizers/base.py get_keys_to_not_convert)."""
    if qc.get("fmt", "e4m3") not in ("e4m3", "float8_e4m3fn"):
        raise _bad(where, "fmt", "e4m3", qc.get("fmt"))
    if qc.get("activation_scheme", "dynamic") not in ("dynamic", "static"):
        raise _bad(where, "activation_scheme", "dynamic or static", qc.get("activation_scheme"))
    block = qc.get("weight_block_size")
    if block is None:
        scheme, how = fp8(static=qc.get("activation_scheme", "dynamic") == "static"), "per-tensor"
    else:
        if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
            raise _bad(where, "weight_block_size", "two positive integers [n, k]", block)
        scheme, how = fp8_block((block[0], block[1])), f"block-scaled {block[0]}×{block[1]}"
    kept = _names(qc, "modules_to_not_convert", where) + _names(qc, "ignored_layers", where)
    return Quantization(f"fp8 ({how}, {qc.get('activation_scheme', 'dynamic')} activations)", where,
                        default=scheme, rules=_kept(kept, "hf"))


@reader("fbgemm_fp8")
def _fbgemm_fp8(qc: dict, where: str) -> Quantization:
    """FBGEMM FP8: per-channel weights, per-token dynamic activations (transformers FbgemmFp8Config)."""
    return Quantization("fbgemm_fp8 (per-channel weights, per-token activations)", where,
                        default=fp8(per="channel"), rules=_kept(_names(qc, "modules_to_not_convert", where), "hf"))


@reader("mxfp4")
def _mxfp4(qc: dict, where: str) -> Quantization:
    """MXFP4 (gpt-oss): every linear not in ``modules_to_not_convert``; gpt-oss lists its
    attention, routers, embedding and lm_head there, so only the experts are MXFP4."""
    return Quantization("mxfp4", where, default=mxfp4(), rules=_kept(_names(qc, "modules_to_not_convert", where), "hf"))


@reader("awq")
def _awq(qc: dict, where: str) -> Quantization:
    """AWQ (AutoAWQ GEMM/GEMV format): 4-bit weights, an fp16 scale and (``zero_point``) a
    4-bit zero per ``group_size`` input elements."""
    _int(qc, "bits", where, 4, allowed=(4,))
    group = _int(qc, "group_size", where, 128)
    zero = qc.get("zero_point", True)
    if not isinstance(zero, bool):
        raise _bad(where, "zero_point", "true or false", zero)
    s = int4(group if group > 0 else None, zero=zero)
    return Quantization(f"awq (int4, group {group if group > 0 else 'per channel'})", where, default=s,
                        rules=_kept(_names(qc, "modules_to_not_convert", where), "hf"))


@reader("gptq")
def _gptq(qc: dict, where: str) -> Quantization:
    """GPTQ: ``bits`` 4 or 8, an fp16 scale and a packed zero point (``qzeros``, stored even
    when ``sym``) per ``group_size``; ``lm_head`` says whether the logits GEMM is quantized;
    ``modules_in_block_to_quantize`` limits it to the named layers. The act-order index
    (``g_idx``, one int32 per input row of a layer) is not a per-element cost and is left out."""
    bits = _int(qc, "bits", where, 4, allowed=(4, 8))
    group = _int(qc, "group_size", where, 128)
    g = group if group > 0 else None
    s = int4(g, zero=True) if bits == 4 else int8_weight_only(g, zero=True)
    lm_head = qc.get("lm_head", False)
    if not isinstance(lm_head, bool):
        raise _bad(where, "lm_head", "true or false", lm_head)
    only = qc.get("modules_in_block_to_quantize")
    if only is None:
        return Quantization(f"gptq (int{bits}, group {group if g else 'per channel'})", where, default=s, lm_head=lm_head)
    if not isinstance(only, list) or not all(isinstance(x, list) and all(isinstance(n, str) for n in x) for x in only):
        raise _bad(where, "modules_in_block_to_quantize", "lists of module names", only)
    rules = [Rule(n, s, "hf") for x in only for n in x] + ([Rule("lm_head", s, "hf")] if lm_head else [])
    return Quantization(f"gptq (int{bits}, group {group if g else 'per channel'}, listed layers)", where,
                        rules=(*rules, Rule(".*", None, "hf")))


@reader("bitsandbytes")
def _bnb(qc: dict, where: str) -> Quantization:
    """bitsandbytes: 4-bit NF4/FP4 codes with an fp32 absmax per 64 elements (nested to int8
    with an fp32 scale per 256 absmax values under double quantization; bitsandbytes
    functional.quantize_4bit blocksize 64), dequantized for a 16-bit GEMM; or LLM.int8()
    (Dettmers et al., 2022, §3.2: vector-wise int8 weights and activations)."""
    kept = _kept(_names(qc, "llm_int8_skip_modules", where), "hf")
    if qc.get("load_in_4bit"):
        kind = qc.get("bnb_4bit_quant_type", "fp4")
        if kind not in ("nf4", "fp4"):
            raise _bad(where, "bnb_4bit_quant_type", "nf4 or fp4", kind)
        double = bool(qc.get("bnb_4bit_use_double_quant", False))
        weight = "int4+int8/64+fp32/16384" if double else "int4+fp32/64"
        s = Scheme("bnb-4bit", weight, None, None, "w4a16",
                   f"bitsandbytes {kind} (absmax per 64{', double-quantized' if double else ''}), 16-bit activations")
        return Quantization(f"bitsandbytes ({kind})", where, default=s, rules=kept)
    if qc.get("load_in_8bit"):
        return Quantization("bitsandbytes (LLM.int8)", where, default=int8(), rules=kept)
    raise UserError(f"{where}: neither load_in_4bit nor load_in_8bit is true")


@reader("compressed-tensors")
def _compressed(qc: dict, where: str) -> Quantization:
    """compressed-tensors (llm-compressor): ``config_groups`` of ``targets`` with ``weights`` and
    ``input_activations`` arguments; ``ignore`` keeps layers in the model dtype (checked first);
    ``kv_cache_scheme`` the cache's type."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _bad(where, "config_groups", "a mapping of quantization groups", groups)
    rules = list(_kept(_names(qc, "ignore", where), "compressed-tensors"))
    for name, g in groups.items():
        key = f"config_groups.{name}"
        if not isinstance(g, dict):
            raise _bad(where, key, "a mapping", g)
        s = _ct_scheme(g.get("weights"), g.get("input_activations"), where, key)
        rules += [Rule(t, s, "compressed-tensors") for t in _names(g, "targets", f"{where}: {key}")]
    kv = _ct_kv(qc.get("kv_cache_scheme"), where)
    return Quantization(f"compressed-tensors ({qc.get('format', 'unstated format')})", where, rules=tuple(rules),
                        lm_head=True, kv_cache=kv)


def _ct_scheme(w, a, where: str, key: str) -> Scheme:
    if not isinstance(w, dict):
        raise _bad(where, f"{key}.weights", "the weights' quantization arguments", w)
    bits, kind, strategy = w.get("num_bits"), w.get("type", "int"), w.get("strategy", "tensor")
    # NVFP4 presets (llm-compressor) say tensor_group: groups of 16 under one global scale
    group = w.get("group_size") if strategy in ("group", "tensor_group") else None
    act = a if isinstance(a, dict) else None
    a_bits, a_kind = (act.get("num_bits"), act.get("type", "int")) if act else (None, None)
    if kind == "int" and bits == 4 and act is None:
        return int4(group, zero=not w.get("symmetric", True))
    if kind == "int" and bits == 8:
        return int8() if (a_kind, a_bits) == ("int", 8) else int8_weight_only(group, zero=not w.get("symmetric", True))
    if kind == "float" and bits == 8:
        if strategy == "block":
            block = w.get("block_structure")
            if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
                raise _bad(where, f"{key}.weights.block_structure", "two positive integers [n, k]", block)
            return fp8_block((block[0], block[1]))
        return fp8(activations=(a_kind, a_bits) == ("float", 8), per=strategy,
                   static=act is not None and act.get("dynamic") is False)
    if kind == "float" and bits == 4 and group == 16:
        return nvfp4(activations=(a_kind, a_bits) == ("float", 4))
    if kind == "float" and bits == 4 and group == 32:
        return mxfp4("mxfp8" if (a_kind, a_bits) == ("float", 8) else None)
    raise UserError(f"{where}: key '{key}.weights': {kind} {bits}-bit ({strategy}"
                    f"{f', group {group}' if group else ''}) is not a format perfcast prices (int4/int8 weights, "
                    f"fp8 tensor/channel/block, fp4 in groups of 16 (NVFP4) or 32 (MXFP4))")


def _ct_kv(kv, where: str) -> str | None:
    if kv is None:
        return None
    if isinstance(kv, dict) and kv.get("num_bits") == 8 and kv.get("type", "int") in ("float", "int"):
        return "fp8" if kv.get("type") == "float" else "int8"
    raise _bad(where, "kv_cache_scheme", "8-bit float or int", kv)


#: ModelOpt / TensorRT-LLM ``quant_algo`` names (tensorrt_llm/quantization/mode.py QuantAlgo).
#: ModelOpt's FP8 is calibrated: it exports each linear's activation ``input_scale``
#: (modelopt/torch/export/quant_utils.py get_activation_scaling_factor), a static scale.
_MODELOPT: dict[str, Callable[[int | None], Scheme]] = {
    "FP8": lambda g: fp8(static=True),
    "FP8_PER_CHANNEL_PER_TOKEN": lambda g: fp8(per="channel"),
    "FP8_BLOCK_SCALES": lambda g: fp8_block(),
    "NVFP4": lambda g: nvfp4(),
    "W4A16_NVFP4": lambda g: nvfp4(activations=False),
    "W4A16": lambda g: int4(None),
    "W4A16_AWQ": lambda g: int4(g or 128),
    "W4A16_GPTQ": lambda g: int4(g or 128, zero=True),
    "W8A16": lambda g: int8_weight_only(),
    "W8A16_GPTQ": lambda g: int8_weight_only(g or 128, zero=True),
    "W8A8_SQ_PER_CHANNEL": lambda g: int8(),
    "INT8": lambda g: int8(),
    "W4A16_MXFP4": lambda g: mxfp4(),
    "W4A8_MXFP4_MXFP8": lambda g: mxfp4("mxfp8"),
}
_KV = {"FP8": "fp8", "INT8": "int8"}


@reader("modelopt")
def _modelopt(qc: dict, where: str) -> Quantization:
    return _modelopt_algo(qc, where)


def _modelopt_algo(q: dict, where: str) -> Quantization:
    """ModelOpt exports: ``quant_algo`` for every linear not in ``exclude_modules`` (globs), or
    MIXED_PRECISION with one algorithm per layer in ``quantized_layers``; NVFP4 in groups of 16;
    ``kv_cache_quant_algo`` the cache's type. lm_head is quantized unless excluded (the export
    lists it when it is kept)."""
    algo = q.get("quant_algo")
    kv = q.get("kv_cache_quant_algo")
    if kv is not None and kv not in _KV:
        raise _bad(where, "kv_cache_quant_algo", f"one of {', '.join(_KV)} or null", kv)
    kept = _kept(_names(q, "exclude_modules", where) + _names(q, "ignore", where), "glob")
    if algo == "MIXED_PRECISION":
        layers = q.get("quantized_layers")
        if not isinstance(layers, dict) or not layers:
            raise _bad(where, "quantized_layers", "a mapping of module → quant_algo", layers)
        rules = list(kept)
        for mod, spec in layers.items():
            if not isinstance(spec, dict) or spec.get("quant_algo") not in _MODELOPT:
                raise _bad(where, f"quantized_layers.{mod}.quant_algo", f"one of {', '.join(_MODELOPT)}",
                           spec.get("quant_algo") if isinstance(spec, dict) else spec)
            rules.append(Rule(mod, _scheme(spec, where, f"quantized_layers.{mod}"), "glob"))
        return Quantization("modelopt MIXED_PRECISION", where, rules=tuple(rules), lm_head=True,
                            kv_cache=_KV.get(kv))
    if algo not in _MODELOPT:
        raise _bad(where, "quant_algo", f"one of {', '.join(_MODELOPT)} or MIXED_PRECISION", algo)
    return Quantization(f"modelopt {algo}", where, default=_scheme(q, where, ""), rules=kept, lm_head=True,
                        kv_cache=_KV.get(kv))


def _scheme(spec: dict, where: str, prefix: str) -> Scheme:
    algo = spec["quant_algo"]
    group = spec.get("group_size")
    key = f"{prefix}.group_size" if prefix else "group_size"
    if group is not None and (not isinstance(group, int) or group <= 0):
        raise _bad(where, key, "a positive integer", group)
    if "NVFP4" in algo and group not in (None, 16):
        raise _bad(where, key, "16 (NVFP4 has one scale per 16 elements)", group)
    return _MODELOPT[algo](group)
