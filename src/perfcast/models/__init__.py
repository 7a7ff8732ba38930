"""The model catalog: Hugging Face ``config.json`` files shipped with perfcast (no hub access)."""

from perfcast.models.catalog import ModelConfig, catalog_names, load_model_config

__all__ = ["ModelConfig", "catalog_names", "load_model_config"]
