"""Property tests that try to break the report boundary from valid inputs: random design points
of the flash-attention kernels, collectives of random sizes on random topologies, GEMMs of random
shapes on random devices, and a small model's steps at random batch and lengths. Every answer is
a document that validates against its shipped schema and holds no NaN, infinity or negative
figure (150 generated cases, in-process)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzzing import check_answered, run_cli
from perfcast.hardware import device_names, get_device
from perfcast.hardware.topology import topology_names
from perfcast.report.document import problems
from test_output_contract import assert_valid, documents

DEVICES = device_names()
SHIPPED_TOPOLOGIES = topology_names()
OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv")


def answered(schema: str, args: list[str], must_price: bool = True) -> None:
    """The promise, and for a priced case: its document follows the schema, inside the boundary."""
    rc, out, err = run_cli(*args)
    check_answered(rc, out, err, args)
    assert rc == 0 or not must_price, f"{args}: refused a valid case: {err}"
    for doc in documents(out) if rc == 0 else ():
        assert_valid(schema, doc)
        assert problems(doc) == []


def log_int(lo: int, hi: int):
    """Integers spread over orders of magnitude (a uniform draw would all be large)."""
    return st.integers(0, 10**6).map(lambda u: int(lo * (hi / lo) ** (u / 10**6)))


@st.composite
def flash_attention_points(draw):
    padded = draw(st.booleans())
    q_blk, kv_blk = draw(st.sampled_from([16, 32, 64, 128, 256])), draw(st.sampled_from([16, 32, 64, 128, 256]))
    if padded:  # any length: tile counts round up
        t_q, t_kv = draw(log_int(1, 2**17)), draw(log_int(1, 2**17))
    else:  # lengths the tiles divide
        t_q, t_kv = q_blk * draw(log_int(1, 512)), kv_blk * draw(log_int(1, 512))
    point = dict(B=draw(log_int(1, 256)), H=draw(st.integers(1, 128)), T_q=t_q, T_kv=t_kv,
                 hd_qk=draw(st.sampled_from([32, 64, 80, 96, 128, 192, 256])),
                 hd_v=draw(st.sampled_from([32, 64, 128, 256])), q_blk=q_blk, kv_blk=kv_blk)
    args = ["kernel", draw(st.sampled_from(["flash-attention", "flash-attention-softmax"])),
            "--device", draw(st.sampled_from(DEVICES)), "--json", *(["--padded"] if padded else [])]
    for k, v in point.items():
        args += ["--set", f"{k}={v}"]
    args += draw(st.sampled_from([[], [], ["--overlap", "double-buffer"], ["--rollup", "both"]]))
    return args


@settings(max_examples=50, deadline=None)
@given(flash_attention_points())
def test_flash_attention_at_random_points_stays_inside_the_boundary(args):
    answered("kernel", args)


@st.composite
def collectives(draw):
    op = draw(st.sampled_from(OPS))
    op = op.replace("_", "-") if draw(st.booleans()) else op  # both spellings
    nbytes = draw(st.one_of(log_int(1, 10**12).map(str), st.floats(1.0, 1e12).map(lambda x: f"{x:.6g}")))
    if draw(st.booleans()):  # an ad-hoc tier: every group up to its size, stride 1, prices
        kind = draw(st.sampled_from(["ring", "switch", "full_mesh", "torus", "mesh"]))
        if kind in ("torus", "mesh"):
            dims = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3))
            shape = "x".join(map(str, dims))
            size = 1
            for d in dims:
                size *= d
        else:
            size = draw(st.integers(1, 64))
            shape = str(size)
        args = ["collective", op, "--topology", f"{kind}:{shape}", "--bytes", nbytes,
                "--link-bandwidth", f"{draw(st.floats(1e6, 1e13)):.6g}",
                "--link-latency", f"{draw(st.sampled_from([0.0, 1e-7, 2e-6, 1e-4])):g}",
                "--group-size", str(draw(st.integers(1, size))), "--json"]
        return args, True
    topology = draw(st.sampled_from(SHIPPED_TOPOLOGIES))
    group = draw(st.sampled_from([1, 2, 4, 8, 16, 64, 128]))
    stride = draw(st.sampled_from([1, 1, 2, 8]))
    return ["collective", op, "--topology", topology, "--bytes", nbytes, "--group-size", str(group),
            "--stride", str(stride), "--json"], False  # a group a tier cannot hold is refused (exit 2)


@settings(max_examples=50, deadline=None)
@given(collectives())
def test_collectives_of_random_sizes_stay_inside_the_boundary(case):
    args, must_price = case
    answered("collective", args, must_price)


@st.composite
def gemms(draw):
    m, k, n = draw(log_int(1, 65536)), draw(log_int(1, 65536)), draw(log_int(1, 65536))
    batched = draw(st.booleans())
    b = draw(st.integers(1, 64))
    shapes = [f"{b}x{m}x{k}", f"{b}x{k}x{n}"] if batched else [f"{m}x{k}", f"{k}x{n}"]
    device = draw(st.sampled_from(DEVICES))
    rates = get_device(device).spec.datasheet.matrix_flops_per_s  # a dtype the device has a rate for
    return ["op", "bmm" if batched else "mm", "--shape", shapes[0], "--shape", shapes[1],
            "--dtype", draw(st.sampled_from([t for t in ("bf16", "fp16", "fp32") if t in rates])),
            "--device", device, "--json"]


@settings(max_examples=40, deadline=None)
@given(gemms())
def test_gemms_of_random_shapes_stay_inside_the_boundary(args):
    answered("op", args)


TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
        "max_position_embeddings": 65536, "tie_word_embeddings": False}


@st.composite
def steps(draw):
    decode = draw(st.booleans())
    args = ["text-generate", "--device", draw(st.sampled_from(["h100-sxm", "h200-sxm", "b200-sxm", "mi300x"])),
            "--num-queries", str(draw(log_int(1, 256))), "--json"]
    if decode:
        return args + ["--decode", "--context-length", str(draw(log_int(1, 32768)))]
    return args + ["--query-length", str(draw(log_int(1, 8192))),
                   "--context-length", str(draw(st.sampled_from([0, 0, 128, 4096])))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    config = tmp_path_factory.mktemp("tiny") / "config.json"
    config.write_text(json.dumps(TINY))
    return str(config)


@settings(max_examples=10, deadline=None)
@given(args=steps())
def test_a_small_model_at_random_points_stays_inside_the_boundary(tiny, args):
    answered("text-generate", [args[0], tiny, *args[1:]])
