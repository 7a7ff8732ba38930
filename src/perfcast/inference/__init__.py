"""Applications on top of capture and pricing: text generation."""
