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


# -- the vision encoder's capture ---------------------------------------------------------------


def test_window_lengths_by_hand():
    from perfcast.capture.vision import window_lengths

    # 1080×1920 on Qwen2.5-VL: 78×138 patches = 39×69 merged tokens; windows of 112/14/2 = 4
    # merged tokens a side: rows 39 = 9·4 + 3, columns 69 = 17·4 + 1, so 9·17 = 153 windows of
    # 4·4·2² = 64 patches, 9 of 4·1·4 = 16, 17 of 3·4·4 = 48 and one of 3·1·4 = 12 — together
    # 153·64 + 9·16 + 17·48 + 12 = 10,764 = 78·138 patches.
    w = window_lengths((1, 78, 138), 2, 4)
    assert w == {64: 153, 16: 9, 48: 17, 12: 1}
    assert sum(n * c for n, c in w.items()) == 78 * 138


@pytest.fixture(scope="module")
def qwen25_encoder():
    from perfcast.capture import hf_config, lower
    from perfcast.capture.vision import Images, capture_encoder
    from perfcast.ir import Loop

    cap = capture_encoder(hf_config(load_model_config("qwen2.5-vl-7b-instruct")), Images(1, (1, 32, 32)))
    low = lower(cap)
    return cap, low, {op.name: op for op in low.graph.ops if isinstance(op, Loop)}


def test_encoder_block_flops_by_hand(qwen25_encoder):
    from perfcast.ir import FLOPS_MATRIX, cost

    _, low, loops = qwen25_encoder
    # One 448×448 image: 32×32 = 1024 patches of width 1280, 16 heads of 80, MLP 3420.
    # qkv 2·1024·1280·3840 = 10,066,329,600; proj 2·1024·1280·1280 = 3,355,443,200;
    # gate + up 2·(2·1024·1280·3420) = 17,930,649,600; down 2·1024·3420·1280 = 8,965,324,800.
    linears = 10_066_329_600 + 3_355_443_200 + 17_930_649_600 + 8_965_324_800
    # Windowed blocks: 16 windows of 64 patches, non-causal: 2·16 windows·16 heads·64²·(80+80)
    # = 335,544,320. Full-attention blocks (7, 15, 23, 31): 2·16·1024²·160 = 5,368,709,120.
    assert loops["layers[0]×28"].n_iter == 28 and loops["layers[7]×4"].n_iter == 4
    assert cost(loops["layers[0]×28"].body)[FLOPS_MATRIX] == linears + 335_544_320 == 40_653_291_520
    assert cost(loops["layers[7]×4"].body)[FLOPS_MATRIX] == linears + 5_368_709_120 == 45_686_456_320
    assert not low.unknown


def test_encoder_patch_embed_and_merger_by_hand(qwen25_encoder):
    from perfcast.ir import FLOPS_MATRIX, Leaf, cost

    _, low, _ = qwen25_encoder
    def flops(prefix):
        return sum(cost(op).get(FLOPS_MATRIX) for op in low.graph.ops if isinstance(op, Leaf) and op.name.startswith(prefix))

    # patch embedding: a Conv3d with stride = kernel, i.e. 1024 patches × (3·2·14·14 = 1176) by
    # 1176 × 1280: 2·1024·1176·1280 = 3,082,813,440
    assert flops("visual.patch_embed") == 2 * 1024 * 1176 * 1280 == 3_082_813_440
    # merger: 256 tokens of 4·1280 = 5120 → 5120 → 3584: 2·256·5120·5120 + 2·256·5120·3584
    assert flops("model.layers.32.mlp") == 2 * 256 * 5120 * (5120 + 3584) == 22_817_013_760
    # the rest (rotary table, window reordering, norms) is memory-bound
    assert flops("visual.rotary") == flops("visual.window_index") == 0


@pytest.mark.parametrize("name, expected", [
    # the checkpoints' own tensor counts (SOURCES.yaml notes): 8,767,123,696 and 31,070,754,032;
    # Qwen2.5-VL-7B: 676,550,144 (encoder) + 7,615,616,512 (language model)
    ("qwen3-vl-8b-instruct", 8_767_123_696), ("qwen3-vl-30b-a3b-instruct", 31_070_754_032),
    ("qwen2.5-vl-7b-instruct", 8_292_166_656)])
def test_parameters_match_the_checkpoints(name, expected):
    from perfcast.capture import hf_config
    from perfcast.capture.build import build_model
    from perfcast.capture.vision import encoder_parameters

    model = load_model_config(name)
    lm = build_model(hf_config(vision.language_model(model)), "bf16")
    assert sum(p.numel() for p in lm.parameters()) + encoder_parameters(hf_config(model))[0] == expected


def test_tensor_parallel_encoder_shards():
    from perfcast.capture import hf_config
    from perfcast.capture.vision import encoder_parameters

    cfg = hf_config(load_model_config("qwen2.5-vl-7b-instruct"))
    full, half = encoder_parameters(cfg)[0], encoder_parameters(cfg, tp=2)[0]
    # tp 2 halves qkv, proj, gate/up/down and the merger's two linears, not their output biases
    # (proj, down, fc2: 32·1280 + 32·1280 + 3584), the norms (2·32·1280 + 1280) or the patch
    # embedding (1280·1176): (full − replicated)/2 + replicated
    replicated = 32 * 1280 * 2 + 3584 + 2 * 32 * 1280 + 1280 + 1280 * 1176
    assert half == (full - replicated) // 2 + replicated


# -- text-generate with images ------------------------------------------------------------------


def _step(name="qwen2.5-vl-7b-instruct", images=None, **kw):
    from perfcast.hardware import get_device
    from perfcast.inference.textgen import Request, simulate

    kw.setdefault("engine", "vllm")
    return simulate(Request(load_model_config(name), get_device("h200-sxm"), num_queries=2, query_length=128,
                            images=images, **kw))


@pytest.fixture(scope="module")
def with_and_without():
    from perfcast.inference.vision import ImageRequest

    return _step(images=ImageRequest(1, 448, 448)), _step()


def test_prefill_with_images_costs_more(with_and_without):
    img, txt = with_and_without
    # 448×448 on Qwen2.5-VL: 32×32 patches, 256 tokens; the prefill is 128 text + 256 image tokens
    assert img.request.query_length == 128 + 256 and txt.request.query_length == 128
    assert img.vision.images == 2 and img.vision.tokens_per_image == 256 and img.vision.patches == 2 * 1024
    enc = img.vision.time_s("analytic")
    assert enc > 0
    assert img.step_time_s("analytic") == pytest.approx(img.evaluations["analytic"].time_s + enc)
    assert img.step_time_s("analytic") > txt.step_time_s("analytic") + enc  # the image tokens cost too
    assert not img.vision.lowered.unknown and not img.lowered.unknown


def test_memory_includes_the_encoder(with_and_without):
    img, txt = with_and_without
    enc_bytes = 676_550_144 * 2  # the encoder's parameters in bf16, resident in both steps
    assert img.vision.weights_bytes == txt.vision.weights_bytes == enc_bytes
    assert img.memory.parameters == txt.memory.parameters == 8_292_166_656
    lm_only = _lm_weights_bytes()
    assert img.memory.weights_bytes == txt.memory.weights_bytes == lm_only + enc_bytes
    assert img.memory.activation_peak_bytes >= img.vision.activation_peak_bytes > 0


def _lm_weights_bytes():
    from perfcast.capture import hf_config
    from perfcast.capture.build import build_model

    lm = build_model(hf_config(vision.language_model(load_model_config("qwen2.5-vl-7b-instruct"))), "bf16")
    return sum(p.numel() for p in lm.parameters()) * 2


def test_encoder_cache_free_attention(with_and_without):
    from perfcast.ir import leaves

    img, _ = with_and_without
    found = [leaf for leaf in leaves(img.vision.lowered.graph) if leaf.kind == "attention"]
    assert found and all(leaf.attr("cache_write") is False for leaf in found)
    assert not [leaf for leaf in leaves(img.vision.lowered.graph) if leaf.attr("kernel_class") == "cache_write"]


def test_encoder_layout_follows_the_engine():
    from perfcast.capture.parallel import Layout
    from perfcast.inference.vision import ImageRequest

    im = ImageRequest(1, 448, 448)
    tp_vllm = _step("qwen3-vl-8b-instruct", im, layout=Layout(tp=2))
    tp_trt = _step("qwen3-vl-8b-instruct", im, layout=Layout(tp=2), engine="trtllm")
    assert tp_vllm.vision.tp == 2 and tp_trt.vision.tp == 1
    assert tp_vllm.vision.weights_bytes < tp_trt.vision.weights_bytes == 576_388_336 * 2
    from perfcast.ir import Leaf, walk

    calls = sum(int(v.trips) for v in walk(tp_vllm.vision.lowered.graph)
                if isinstance(v.op, Leaf) and v.op.kind == "all_reduce")
    # two all-reduces per block (after attention, after the MLP) × 27 blocks, one per merger
    # (the final one and 3 DeepStack mergers): 2·27 + 4 = 58
    assert calls == 2 * 27 + 4 == 58
    assert not [v for v in walk(tp_trt.vision.lowered.graph) if isinstance(v.op, Leaf) and v.op.kind == "all_reduce"]


def test_encoder_data_parallel_over_tp():
    from perfcast.capture.parallel import Layout
    from perfcast.inference.vision import ImageRequest
    from perfcast.ir import Leaf, walk

    # 2 sequences × 2 images of 448² over tp 4: ⌈4/4⌉ = 1 image per rank, full weights
    r = _step("qwen3-vl-8b-instruct", ImageRequest(2, 448, 448), layout=Layout(tp=4), encoder_tp_mode="data")
    assert r.vision.mode == "data" and r.vision.images == 1 and r.vision.weights_bytes == 576_388_336 * 2
    gathers = [v.op for v in walk(r.vision.lowered.graph) if isinstance(v.op, Leaf) and v.op.kind == "all_gather"]
    # one all-gather of each rank's 196 tokens × (4096 merged + 3 DeepStack levels × 4096) bf16
    assert len(gathers) == 1 and tuple(gathers[0].inputs[0].shape) == (196, 4 * 4096)
    assert tuple(gathers[0].outputs[0].shape) == (4 * 196, 4 * 4096)
    assert not [v for v in walk(r.vision.lowered.graph) if isinstance(v.op, Leaf) and v.op.kind == "all_reduce"]


def test_decode_of_a_vlm_is_its_language_model():
    r = _step(decode=True, context_length=2048)
    assert r.vision.images == 0 and r.vision.time_s("analytic") == 0.0
    assert r.memory.parameters == 8_292_166_656


@pytest.mark.parametrize("args, message", [
    (["qwen3-8b", "--image-batch-size", "1", "--image-height", "448", "--image-width", "448"], "text-only"),
    (["qwen2.5-vl-7b-instruct", "--decode", "--context-length", "100", "--image-batch-size", "1",
      "--image-height", "448", "--image-width", "448"], "decode"),
    (["qwen2.5-vl-7b-instruct", "--image-batch-size", "1", "--image-height", "448"], "--image-width"),
    (["qwen2.5-vl-7b-instruct", "--image-batch-size", "0", "--image-height", "448", "--image-width", "448"],
     "at least 1"),
    (["qwen2.5-vl-7b-instruct", "--image-batch-size", "1", "--image-height", "10", "--image-width", "3000"],
     "aspect"),
    (["qwen2.5-vl-7b-instruct", "--image-batch-size", "1", "--image-height", "448", "--image-width", "448",
      "--rollup", "slow"], "--rollup slow"),
    (["qwen2.5-vl-7b-instruct", "--engine", "trtllm", "--tp-size", "2", "--encoder-tp-mode", "weights"], "replicated"),
    (["qwen3-8b", "--tp-size", "2", "--encoder-tp-mode", "data"], "no vision encoder"),
    (["qwen2.5-vl-7b-instruct", "--encoder-tp-mode", "data"],
     "--encoder-tp-mode: how the vision encoder runs over --tp-size ranks; with --tp-size 1 every mode is the same"),
])
def test_flag_errors(cli, args, message):
    p = cli("text-generate", *args, "--device", "h200-sxm")
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_images_per_device_follow_the_layout():
    from perfcast.capture.parallel import Layout
    from perfcast.inference.vision import ImageRequest

    # 2 sequences × 2 images; pipeline stages: the first stage encodes both micro-batches' images
    r = _step(images=ImageRequest(2, 448, 448), layout=Layout(pp=2))
    assert r.request.micro_batches == 2 and r.vision.images == 2 * 2
    assert r.step_time_s("analytic") == pytest.approx(sum(r.stage_times_s["analytic"]) + max(r.stage_times_s["analytic"])
                                                      + r.vision.time_s("analytic"))


def test_explain_gives_the_language_model(cli):
    import json

    p = cli("explain", "qwen2.5-vl-7b-instruct", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc["symbols"]) == {"B", "S"} and any("vision-language model" in n for n in doc["notes"])


def test_processor_beside_a_config_path(tmp_path):
    import json
    import shutil

    src = load_model_config("qwen2.5-vl-7b-instruct").path
    shutil.copy(src, tmp_path / "config.json")
    # a deployment that caps images at 1,003,520 pixels (= 1280·28²): round-to-28 gives
    # 1092·1932 > the cap, so beta = sqrt(2,073,600/1,003,520) ≈ 1.43747 and the sides are
    # floor(1080/beta/28)·28 = floor(26.83)·28 = 728 and floor(1920/beta/28)·28 = floor(47.70)·28
    # = 1316: 52×94 patches, 52·94/4 = 1222 tokens
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"min_pixels": 3136, "max_pixels": 1003520, "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}))
    p = vision.processor(load_model_config(str(tmp_path / "config.json")))
    assert p.source.endswith("preprocessor_config.json")
    assert p.resized(1080, 1920) == (728, 1316) and p.tokens(1080, 1920) == 52 * 94 // 4 == 1222
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"max_pixels": 1003520}))
    with pytest.raises(UserError, match="min_pixels"):
        vision.processor(load_model_config(str(tmp_path / "config.json")))


def test_non_causal_attention_is_priced_at_its_own_work():
    from perfcast.ir import Tensor
    from perfcast.ir.rules import make_leaf
    from perfcast.perf.features import features
    from perfcast.perf.classify import classify
    from perfcast.perf.kernel_classes import CONTEXT, context_work

    q = Tensor("q", (16, 16, 64, 80), "bf16")
    kv = Tensor("k", (16, 16, 64, 80), "bf16")
    out = Tensor("o", (16, 64, 16, 80), "bf16")

    def leaf(causal):
        return make_leaf("attention", "a", (q, kv, kv), (out,), past=0, causal=causal, window=0, shared_kv=False,
                         cache_width=0, cache_write=False)

    cls, shape = classify(leaf(False))
    assert cls is CONTEXT and shape["causal"] is False
    # 16 windows × 16 heads, 64 queries each over all 64 keys: 2·16·16·64²·(80 + 80) = 335,544,320
    assert context_work(shape, 132).flops == 2 * 16 * 16 * 64 * 64 * 160 == 335_544_320
    # the causal kernel at the same shape: 64·65/2 pairs per head
    assert float(context_work(classify(leaf(True))[1], 132).flops) == 2 * 16 * 16 * (64 * 65 // 2) * 160
    # the measured tables hold causal prefill only: the profiling model misses (and falls back)
    with pytest.raises(ValueError, match="non-causal"):
        features(leaf(False))
