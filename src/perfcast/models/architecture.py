"""The architecture table (``architectures.yaml``): one row per config ``model_type`` saying how
perfcast reads and captures it. Reading it needs no torch; the capture applies it.

A row names the model's sequence-mixer and expert module classes and the perfcast kind that
captures each (``parts``), and, where an architecture departs from the common decoder layout,
the config keys and module-path segments under other names (``keys``, ``modules``), the config
defaults a file may leave out (``derived``), a language model inside a wrapper config
(``language_model``), the keys tensor parallelism divides and the modules a quantized checkpoint
keeps in the model dtype whatever its config says (``keep_unquantized``). Everything else about a model is
read from its config and its transformers module tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from perfcast.inputs import excerpt, load_yaml
from perfcast.ir import UserError

_ROW_KEYS = frozenset({"description", "language_model", "keys", "derived", "modules", "layers", "parts",
                       "attn_implementation", "experts", "dense_intermediate", "tensor_parallel",
                       "head_projections", "no_tensor_parallel", "rope_aliases", "keep_unquantized",
                       "sources"})
#: the perfcast kinds a row may name (perfcast.capture.substitutions registers one handler each)
KINDS = ("attention", "mla", "dsa", "gated_delta_net", "falcon", "experts", "llama4_moe")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    description: str = ""
    language_model: dict | None = None
    keys: dict = field(default_factory=dict)
    derived: dict = field(default_factory=dict)
    modules: dict = field(default_factory=dict)
    layers: str = "model.layers"
    parts: dict = field(default_factory=dict)
    attn_implementation: str | None = None
    experts: dict = field(default_factory=dict)
    dense_intermediate: tuple = ()
    tensor_parallel: tuple = ()
    head_projections: dict = field(default_factory=dict)
    no_tensor_parallel: str | None = None
    sources: tuple = ()
    rope_aliases: dict = field(default_factory=dict)
    #: modules a transformers-read checkpoint never quantizes: the model class's
    #: ``_keep_in_fp32_modules``, which transformers' quantizers add to ``modules_to_not_convert``
    keep_unquantized: tuple = ()

    def canonical(self, path: str) -> str:
        """A module or parameter path in perfcast's canonical naming (``transformer.h.3.attn`` →
        ``model.layers.3.self_attn``)."""
        if not self.modules or not path:
            return path
        return ".".join(self.modules.get(seg, seg) for seg in path.split("."))

    @property
    def expert_intermediate(self) -> str | None:
        return self.experts.get("intermediate")

    def intermediate_keys(self) -> tuple[str, ...]:
        """Config keys of dense MLP widths (divided by tensor parallelism)."""
        if self.dense_intermediate:
            return tuple(self.dense_intermediate)
        return () if self.expert_intermediate == "intermediate_size" else ("intermediate_size",)


def _path():
    return resources.files("perfcast.models") / "architectures.yaml"


@lru_cache(maxsize=None)
def table() -> dict[str, Architecture]:
    raw = load_yaml(str(_path())) or {}
    out = {}
    for model_type, row in raw.items():
        where = f"architectures.yaml: key {model_type!r}"
        unknown = set(row) - _ROW_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r}")
        if not row.get("parts") and not row.get("language_model"):
            raise ValueError(f"{where}: a row needs parts or language_model")
        for cls, kind in (row.get("parts") or {}).items():
            if kind not in KINDS:
                raise ValueError(f"{where}.parts.{cls}: unknown kind {kind!r} (known: {', '.join(KINDS)})")
        out[model_type] = Architecture(
            model_type, row.get("description", ""), row.get("language_model"), dict(row.get("keys") or {}),
            dict(row.get("derived") or {}), dict(row.get("modules") or {}), row.get("layers", "model.layers"),
            dict(row.get("parts") or {}), row.get("attn_implementation"), dict(row.get("experts") or {}),
            tuple(row.get("dense_intermediate") or ()), tuple(row.get("tensor_parallel") or ()),
            dict(row.get("head_projections") or {}), row.get("no_tensor_parallel"),
            tuple(row.get("sources") or ()), dict(row.get("rope_aliases") or {}),
            tuple(row.get("keep_unquantized") or ()))
    return out


def known() -> tuple[str, ...]:
    return tuple(sorted(table()))


def architecture(model_type: str, where: str = "config") -> Architecture:
    """The row of ``model_type``; a model type without one is a one-line UserError."""
    row = table().get(model_type)
    if row is None:
        import difflib

        close = difflib.get_close_matches(model_type, known(), n=3, cutoff=0.5) if isinstance(model_type, str) else []
        raise UserError(f"{where}: key 'model_type': {excerpt(model_type)} is not an architecture perfcast knows "
                        f"(src/perfcast/models/architectures.yaml has {len(known())} rows"
                        + (f"; closest: {', '.join(close)})" if close else ", e.g. llama, qwen3, deepseek_v3)"))
    return row


def canonical_config(data: dict, arch: Architecture) -> dict:
    """The config with perfcast's key names (``n_embd`` → ``hidden_size``) and the config class's
    defaults for the keys the file leaves out (``derived``)."""
    out = {arch.keys.get(k, k): v for k, v in data.items()}
    for key, rules in arch.derived.items():
        for rule in rules if isinstance(rules, list) else [rules]:
            if out.get(key) is not None:
                break
            if "product" in rule:
                base, factor = rule["product"]
                # only from an integer: a bad base is left for the config's validation to name
                if isinstance(out.get(base), int) and not isinstance(out[base], bool):
                    out[key] = out[base] * int(factor)
            elif "copy" in rule:
                out[key] = out.get(rule["copy"])
            elif all(out.get(k, False) == v for k, v in rule["when"].items()):
                out[key] = rule["value"]
    return out


def file_config(data: dict, arch: Architecture) -> dict:
    """The config under the file's own key names again, for the transformers config class."""
    back = {v: k for k, v in arch.keys.items()}
    return {back.get(k, k): v for k, v in data.items()}
