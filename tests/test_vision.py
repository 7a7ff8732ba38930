"""Vision-language models: image tokens, the vision encoder's capture and cost, text-generate
with images, and the flags that cannot apply."""

from __future__ import annotations

import pytest

from perfcast.ir import UserError
from perfcast.models import load_model_config
from perfcast.models import vision


def test_image_tokens_by_hand():
    # Qwen2.5-VL: patch 14, merge 2, factor 28. 1080×1920 → sides rounded to the factor:
    # round(1080/28)=39 → 1092, round(1920/28)=69 → 1932; 1092·1932 = 2,109,744 lies inside
    # [3136, 12,845,056]; grid 1092/14 × 1932/14 = 78 × 138 patches; tokens 78·138/2² = 2691.
    p = vision.processor(load_model_config("qwen2.5-vl-7b-instruct"))
    assert p.resized(1080, 1920) == (1092, 1932)
    assert p.grid(1080, 1920) == (1, 78, 138)
    assert p.tokens(1080, 1920) == 2691
    # Qwen3-VL: patch 16, merge 2, factor 32. 448×448 → 448 = 14·32; 28×28 patches → 196 tokens.
    q = vision.processor(load_model_config("qwen3-vl-8b-instruct"))
    assert q.tokens(448, 448) == 196
    # below min_pixels 65,536: 100×100 → beta = sqrt(65536/10000) = 2.56, ceil(256/32)·32 = 256
    assert q.resized(100, 100) == (256, 256) and q.tokens(100, 100) == 64


def _transformers_smart_resize():
    """transformers 5.24.0's own ``smart_resize`` (its module imports torchvision/PIL, absent
    here, so the function is read out of the source file and run alone)."""
    import ast
    import math
    from pathlib import Path

    import transformers

    path = Path(transformers.__file__).parent / "models/qwen2_vl/image_processing_pil_qwen2_vl.py"
    tree = ast.parse(path.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize"]
    scope = {"math": math}
    exec(compile(ast.Module([fn], []), str(path), "exec"), scope)
    return scope["smart_resize"]


@pytest.mark.parametrize("hw", [(1080, 1920), (100, 100), (4000, 3000), (28, 5000), (737, 211)])
def test_resize_matches_transformers(hw):
    smart_resize = _transformers_smart_resize()
    for name in ("qwen2.5-vl-7b-instruct", "qwen3-vl-8b-instruct"):
        p = vision.processor(load_model_config(name))
        assert p.resized(*hw) == smart_resize(*hw, factor=p.factor, min_pixels=p.min_pixels,
                                              max_pixels=p.max_pixels)


def test_extreme_aspect_ratio_is_refused():
    p = vision.processor(load_model_config("qwen2.5-vl-7b-instruct"))
    with pytest.raises(UserError, match="aspect"):
        p.tokens(10, 3000)


def test_language_model_config():
    lm = vision.language_model(load_model_config("qwen3-vl-8b-instruct"))
    assert lm.model_type == "qwen3_vl_text" and lm.data["num_hidden_layers"] == 36
    lm25 = vision.language_model(load_model_config("qwen2.5-vl-7b-instruct"))
    assert lm25.model_type == "qwen2_5_vl_text" and "vision_config" not in lm25.data
