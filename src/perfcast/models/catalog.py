"""Model configs by catalog name or path. Reading a config needs no torch: the catalog and
``perfcast models`` stay light; building the model is the capture's job."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from perfcast.inputs import excerpt, load_yaml, read_json
from perfcast.ir import UserError
from perfcast.models.architecture import Architecture, architecture, canonical_config
from perfcast.models.validate import check_aliases, check_config


@dataclass(frozen=True)
class ModelConfig:
    """A model's config. ``data`` is the language model perfcast prices, under perfcast's key
    names (:func:`perfcast.models.architecture.canonical_config`); for a wrapper config (a
    vision-language checkpoint) ``wrapper`` is the whole file and ``data`` its language model."""

    name: str
    data: dict
    path: Path
    source: dict  # hf_repo, source, license (catalog entries)
    wrapper: dict | None = None

    @property
    def model_type(self) -> str:
        """The file's model type (``kimi_k25`` for Kimi-K2.5, whose language model is deepseek_v3)."""
        return (self.wrapper or self.data)["model_type"]

    @property
    def architecture(self) -> Architecture:
        """The architecture row of the language model (``data["model_type"]``)."""
        return architecture(self.data["model_type"], str(self.path))


def config_folder():
    """The shipped configs (a ``Traversable``)."""
    return resources.files("perfcast.models") / "configs"


def catalog_names() -> list[str]:
    return sorted(Path(str(p)).stem for p in config_folder().iterdir() if str(p).endswith(".json"))


def _sources() -> dict:
    return load_yaml(str(config_folder() / "SOURCES.yaml")) or {}


def load_model_config(name_or_path: str) -> ModelConfig:
    """A catalog entry by name, or a ``config.json`` path, checked as a whole
    (:mod:`perfcast.models.validate`); bad input is a one-line UserError."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.exists():
        name, source = path.stem if path.name != "config.json" else path.parent.name or "model", {}
    else:
        names = catalog_names()
        if name_or_path not in names:
            close = difflib.get_close_matches(name_or_path, names, n=3, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
            raise UserError(f"unknown model {excerpt(name_or_path)}{hint}")
        name, path = name_or_path, Path(str(config_folder() / f"{name_or_path}.json"))
        source = _sources().get(name, {})
    data = read_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    if "model_type" not in data:
        raise UserError(f"{path}: key 'model_type': missing (expected a Hugging Face config.json)")
    if not isinstance(data["model_type"], str):
        raise UserError(f"{path}: key 'model_type': expected a string, got {excerpt(data['model_type'])}")
    from perfcast.models import vision  # vision-language types: their own module

    if data["model_type"] in vision.FAMILIES:
        model = ModelConfig(name, data, path, source or {})
        vision.check(model)
        return model
    return language_model(name, data, path, source)


def language_model(name: str, data: dict, path: Path, source: dict | None = None) -> ModelConfig:
    """The model perfcast prices from a config file's contents: the file itself, or the language
    model of a wrapper config (its row's ``language_model``), with perfcast's key names."""
    if not isinstance(data.get("model_type"), str):
        raise UserError(f"{path}: key 'model_type': expected a string, got {excerpt(data.get('model_type'))}")
    arch = architecture(data["model_type"], str(path))
    wrapper, prefix = None, ""
    if arch.language_model:
        key = arch.language_model["config"]
        inner = data.get(key)
        if not isinstance(inner, dict):
            raise UserError(f"{path}: key {key!r}: missing (a {arch.model_type} config holds its language model there)")
        wrapper, data, prefix = data, dict(inner), f"{key}."
        data["model_type"] = arch.language_model.get("model_type") or data.get("model_type")
        # the wrapper's own embedding tying applies to its language model when that says nothing
        if "tie_word_embeddings" in wrapper and "tie_word_embeddings" not in data:
            if not isinstance(wrapper["tie_word_embeddings"], bool):
                raise UserError(f"{path}: key 'tie_word_embeddings': expected true or false, got "
                                f"{excerpt(wrapper['tie_word_embeddings'])}")
            data["tie_word_embeddings"] = wrapper["tie_word_embeddings"]
        if not isinstance(data["model_type"], str):
            raise UserError(f"{path}: key '{key}.model_type': expected a string, got {excerpt(data['model_type'])}")
        inner_arch = architecture(data["model_type"], f"{path}: {key}")
        if inner_arch.language_model:
            raise UserError(f"{path}: key {key!r}: a wrapper inside a wrapper ({data['model_type']})")
        arch = inner_arch
    check_aliases(data, arch, str(path), prefix)
    canonical = canonical_config(data, arch)
    check_config(canonical, arch, str(path), prefix)
    return ModelConfig(name, canonical, path, source or {}, wrapper)
