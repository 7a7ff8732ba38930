"""The model catalog: Hugging Face ``config.json`` files shipped with perfcast (no hub access),
and the architecture table that says how each ``model_type`` is captured."""

from perfcast.models.architecture import Architecture, architecture
from perfcast.models.catalog import ModelConfig, catalog_names, language_model, load_model_config

__all__ = ["Architecture", "ModelConfig", "architecture", "catalog_names", "language_model", "load_model_config"]
