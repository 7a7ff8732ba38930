"""Model configs by catalog name or path. Reading a config needs no torch: the catalog and
``perfcast models`` stay light; building the model is the capture's job."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from perfcast.ir import UserError

#: model_type values the capture supports (a transformers architecture whose attention and
#: experts go through the substitutable interfaces, see perfcast.capture.serving).
SUPPORTED = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "mixtral", "deepseek_v3", "gpt_oss")


@dataclass(frozen=True)
class ModelConfig:
    name: str
    data: dict
    path: Path
    source: dict  # hf_repo, source, license (catalog entries)

    @property
    def model_type(self) -> str:
        return self.data["model_type"]


def config_folder():
    """The shipped configs (a ``Traversable``)."""
    return resources.files("perfcast.models") / "configs"


def catalog_names() -> list[str]:
    return sorted(Path(str(p)).stem for p in config_folder().iterdir() if str(p).endswith(".json"))


def _sources() -> dict:
    return yaml.safe_load((config_folder() / "SOURCES.yaml").read_text()) or {}


def load_model_config(name_or_path: str) -> ModelConfig:
    """A catalog entry by name, or a ``config.json`` path; bad input is a one-line UserError."""
    path = Path(name_or_path)
    if name_or_path.endswith(".json") or path.exists():
        name, source = path.stem if path.name != "config.json" else path.parent.name or "model", {}
    else:
        names = catalog_names()
        if name_or_path not in names:
            close = difflib.get_close_matches(name_or_path, names, n=3, cutoff=0.4)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
            raise UserError(f"unknown model {name_or_path!r}{hint}")
        name, path = name_or_path, Path(str(config_folder() / f"{name_or_path}.json"))
        source = _sources().get(name, {})
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON at line {e.lineno}: {e.msg}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise UserError(f"{path}: key 'model_type': missing (expected a Hugging Face config.json)")
    from perfcast.models.vision import FAMILIES  # vision-language types: their own module

    if data["model_type"] not in SUPPORTED and data["model_type"] not in FAMILIES:
        raise UserError(f"{path}: key 'model_type': {data['model_type']!r} is not supported; "
                        f"supported: {', '.join((*SUPPORTED, *FAMILIES))}")
    return ModelConfig(name, data, path, source)
