"""SGLang's MoE exchange under attention data parallelism: the MoE group's gather by default, DeepEP's
low-latency all-to-all with ``--moe-a2a-backend deepep`` — its dispatch and combine priced by the kernel class
fitted on aiconfigurator's measured DeepEP tables (docs/design/calibration.md, "DeepEP's low-latency all-to-all";
docs/design/engines.md, "The MoE token exchange")."""

import json

import pandas as pd
import pytest

from perfcast.hardware.calibration import find_calibration, load_calibration_file
from perfcast.ir import Tensor, make_leaf
from perfcast.perf.classify import classify
from perfcast.perf.kernel_classes import DEEPEP_LL_OP, MOE_A2A, deepep_selection_bytes
from perfcast.perf.databases import find_database
from tests.test_engines import run_cli

DEVICES = {"h100-sxm": 8, "h200-sxm": 8, "b200-sxm": 8, "b300-sxm": 8, "gb200": 4, "gb300": 4}


def _table(device: str) -> pd.DataFrame:
    return pd.read_csv(find_database(device, framework="sglang") / "DeepEPLowLatency.csv.gz")


def test_the_shipped_tables_hold_both_phases_of_one_node():
    """Every row of aiconfigurator's table twice: the dispatch (FP8 on the wire) and the combine (bf16), over
    the GPUs of one node (a GB200 / GB300 compute tray has 4)."""
    for device, gpus in DEVICES.items():
        t = _table(device)
        assert len(t) == 352 and set(t.dtype) == {"fp8", "bf16"} and set(t.devices) == {gpus}
        assert set(t.tokens) == {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}


def test_every_device_with_a_table_has_a_fit_that_holds_out_of_sample():
    for device in DEVICES:
        cal = load_calibration_file(find_calibration(device, "sglang"))
        for variant in ("fp8", "bf16"):
            fit = cal.fits[f"moe_a2a/{variant}"]
            assert fit.rows == 176 and fit.out_of_sample.median < 0.10, (device, variant, fit.out_of_sample)


def test_the_bytes_a_rank_moves_are_deepeps_own_count():
    # deepseek-ai/DeepEP tests/test_low_latency.py: hidden + hidden/128·4 + 16 per FP8 copy, 2·hidden per bf16 one
    assert deepep_selection_bytes("fp8", 7168) == 7168 + 224 + 16
    assert deepep_selection_bytes("bf16", 7168) == 14336
    # the copies for experts on the other 7 of 8 ranks cross NVLink; on 32 ranks, 31 of 32
    w = MOE_A2A.work({"tokens": 64, "top_k": 8, "hidden": 7168, "dtype": "fp8", "devices": 8}, 132)
    assert w.bytes == 64 * 8 * 7408 * 7 / 8 and w.flops == 0
    assert MOE_A2A.work({"tokens": 64, "top_k": 8, "hidden": 7168, "dtype": "bf16", "devices": 32}, 132).bytes == \
        64 * 8 * 14336 * 31 / 32


def test_a_dispatch_leaf_is_classified_by_its_rank_tokens():
    x = Tensor("x", (512, 7168), "bf16")  # 64 tokens × top-k 8 copies
    leaf = make_leaf("all_to_all", "moe/dispatch", [x], [Tensor("y", (512, 7168), "bf16")], op=DEEPEP_LL_OP,
                     collective="all_to_all", axis="ep", group_size=8, top_k=8, wire_dtype="fp8")
    cls, shape = classify(leaf)
    assert cls is MOE_A2A and shape == {"devices": 8, "dtype": "fp8", "tokens": 64, "top_k": 8, "hidden": 7168}


def _kernels(device: str, ep: int, per_rank: int, option: str, decode: bool = True) -> dict:
    rc, out, err = run_cli("text-generate", "deepseek-v3", "--device", device,
                           *(("--decode", "--context-length", "1024") if decode else ("--query-length", "256")),
                           "--num-queries", str(per_rank * ep), "--ep-size", str(ep), "--dp-size", str(ep),
                           "--attention-dp", "--engine", "sglang", "--engine-option", f"moe_a2a_backend={option}",
                           "--json")
    assert rc == 0, err
    doc = json.loads(out)
    return {k["kernel"]: k["time_s"]["analytic"] / k["calls"] for k in doc["engine"]["kernels"]} | {
        "_notes": doc["notes"]}


@pytest.mark.parametrize("device,ep", [("h200-sxm", 8), ("gb200", 4)])
def test_a_decode_steps_dispatch_and_combine_are_priced_as_measured(device, ep):
    """DeepSeek-V3 decode, 64 sequences a rank: the step's two kernels against the measured rows of the same
    shape (hidden 7,168, top-k 8 of 256 experts, 64 tokens a rank) — the fit's error, not a mapping error."""
    k = _kernels(device, ep, 64, "deepep")
    t = _table(device)
    row = t[(t.tokens == 64) & (t.hidden == 7168) & (t.top_k == 8) & (t.experts == 256)].set_index("dtype").latency_us
    assert k["deepep_ll_dispatch"] * 1e6 == pytest.approx(row["fp8"], rel=0.10)
    assert k["deepep_ll_combine"] * 1e6 == pytest.approx(row["bf16"], rel=0.10)
    assert any("moe_a2a/fp8" in n and "moe_a2a/bf16" in n for n in k["_notes"])


def test_sglangs_default_gathers_the_group_and_deepep_exchanges_it():
    """SGLang's LayerCommunicator runs a MoE layer in FULL mode (the attention-DP ranks' tokens gathered into the
    group) unless an all-to-all backend is set; DeepEP's low-latency kernels run in decode, its normal ones in
    prefill (priced as the topology's all-to-all)."""
    none = _kernels("h200-sxm", 8, 64, "none")
    assert "perfcast.all_gather" in none and "perfcast.reduce_scatter" in none and "deepep_ll_dispatch" not in none
    prefill = _kernels("h200-sxm", 8, 4, "deepep", decode=False)
    assert "perfcast.all_to_all" in prefill and "deepep_ll_dispatch" not in prefill


def test_a_group_beyond_one_nvlink_domain_is_priced_on_the_topology_and_says_so():
    k = _kernels("h200-sxm", 16, 64, "deepep")  # two HGX nodes: the measured kernels stayed inside one
    assert "deepep_ll_dispatch" in k
    assert any("moe_a2a: its fit was measured within one NVLink domain and this group spans nvlink and "
               "infiniband: priced on the topology" in n for n in k["_notes"])


def test_the_option_is_refused_where_sglang_does_not_run_it():
    rc, _, err = run_cli("text-generate", "deepseek-v3", "--device", "h200-sxm", "--decode", "--context-length",
                         "1024", "--engine", "vllm", "--engine-option", "moe_a2a_backend=deepep")
    assert rc == 2 and "moe_a2a_backend" in err and err.count("\n") == 1



def test_the_sglang_launch_command_runs_the_all_to_all_it_was_priced_with():
    from perfcast.capture.parallel import Layout
    from perfcast.search.launch import _command
    from perfcast.search.optimize import SearchSpec
    from perfcast.serving.types import SLO

    def argv(options, layout=Layout(dp=8, ep=8, attention_dp=True)):
        spec = SearchSpec("deepseek-v3", ("h200-sxm",), 8, 1024, 1024, SLO(ttft_s=2.0, tpot_s=0.05), engine="sglang",
                          engine_options=options)
        return _command("sglang", "deepseek-ai/DeepSeek-V3", layout, 64, {}, spec, 0.9, None)[0]

    deepep = argv((("moe_a2a_backend", "deepep"),))
    assert deepep[deepep.index("--moe-a2a-backend") + 1] == "deepep" and "--enable-dp-attention" in deepep
    assert "--moe-a2a-backend" not in argv(()) and "--moe-a2a-backend" not in argv((("moe_a2a_backend", "none"),))
    # without attention DP SGLang's tokens are already on every rank: no exchange to choose
    assert "--moe-a2a-backend" not in argv((("moe_a2a_backend", "deepep"),), Layout(tp=8, ep=8))
    # nor where attention DP's MoE group splits its experts (no expert parallelism): priced without it too
    assert "--moe-a2a-backend" not in argv((("moe_a2a_backend", "deepep"),), Layout(dp=8, attention_dp=True))


def test_the_experts_behind_deepep_are_priced_by_its_own_measured_kernel():
    """In decode, DeepEP hands each rank only the tokens routed to its experts, laid out per expert for DeepGEMM's
    masked grouped GEMM (DeepEPMoE.run_moe_core): aiconfigurator's deepepmoe rows, not the MoE tables whose kernel
    takes every token of the group. DeepSeek-V3 (block-FP8 experts) on GB200, EP 32, 64 sequences a rank: the
    step's three expert kernels against the measured row of the same group (2,048 tokens, balanced)."""
    k = _kernels("gb200", 32, 64, "deepep")
    t = pd.read_csv(find_database("gb200", framework="sglang") / "GroupedMatMulDeepEP.csv.gz")
    row = t[(t.tokens == 2048) & (t.moe_ep == 32) & (t.routing == "balanced") & (t.dtype == "fp8_block")]
    assert len(row) == 1 and "fused_moe_triton" not in k
    assert 3 * k["deepep_moe"] * 1e6 == pytest.approx(float(row.latency_us.iloc[0]), rel=0.10)
    assert any("moe.deepep/fp8_block ×58" in n for n in k["_notes"])
    # the gather path's MoE kernel takes all 2,048 tokens of the group: over twice the time (204 against 87 µs)
    none = _kernels("gb200", 32, 64, "none")
    assert 5 * none["fused_moe_triton"] > 2 * 3 * k["deepep_moe"]


def test_nvfp4_experts_behind_deepep_borrow_the_fp8_kernels_fit_and_say_so():
    rc, out, err = run_cli("text-generate", "deepseek-v3.1-nvfp4", "--device", "gb200", "--decode", "--context-length",
                           "1024", "--num-queries", "2048", "--ep-size", "32", "--dp-size", "32", "--attention-dp",
                           "--engine", "sglang", "--engine-option", "moe_a2a_backend=deepep", "--json")
    assert rc == 0, err
    assert any("moe.deepep/fp4 derived from moe.deepep/fp8_block ×58" in n for n in json.loads(out)["notes"])


@pytest.mark.parametrize("argv", [
    ("llama-3.1-8b",),  # no routed experts
    ("deepseek-v3", "--device", "h200-sxm"),  # one device: no exchange
    ("deepseek-v3", "--device", "h200-sxm", "--tp-size", "8", "--ep-size", "8"),  # every rank holds every token
])
def test_the_option_is_refused_where_no_moe_group_exchanges_tokens(argv):
    rc, out, err = run_cli("text-generate", *argv, "--decode", "--context-length", "1024", "--engine", "sglang",
                           "--engine-option", "moe_a2a_backend=deepep")
    assert (rc, out) == (2, "") and "moe_a2a_backend" in err and err.count("\n") == 1


def test_an_instance_without_the_exchange_runs_as_its_layout_fixes():
    """optimize and recommend set an option for every candidate; one whose MoE group exchanges no tokens drops
    it (no DeepEP kernels priced where SGLang would run none)."""
    from perfcast.capture.parallel import Layout
    from perfcast.engines import exchange_options

    options = (("moe_a2a_backend", "deepep"), ("moe_backend", "TRTLLM"))
    assert exchange_options(options, Layout(dp=8, ep=8, attention_dp=True)) == options
    assert exchange_options(options, Layout(tp=8, ep=8)) == (("moe_backend", "TRTLLM"),)


def _step(model: str, per_rank: int, option: str, graphs: int) -> tuple[float, float]:
    """(step, the experts' share) in ms: docs/design/engines.md's GB300 NVL72 example, 32 attention-DP ranks."""
    rc, out, err = run_cli("text-generate", model, "--device", "gb300", "--decode", "--num-queries", str(per_rank * 32),
                           "--context-length", "1536", "--ep-size", "32", "--dp-size", "32", "--attention-dp",
                           "--engine", "sglang", "--kv-cache-dtype", "fp8", "--cuda-graph-max-batch-size", str(graphs),
                           "--engine-option", f"moe_a2a_backend={option}", "--json")
    assert rc == 0, err
    kernels = json.loads(out)["engine"]["kernels"]
    total = sum(k["time_s"]["analytic"] for k in kernels)
    experts = sum(k["time_s"]["analytic"] for k in kernels if k["class"] in ("moe", "moe.deepep"))
    return round(total * 1e3, 1), round(experts * 1e3, 1)


def test_the_engines_doc_example_of_a_gb300_rack():
    """docs/design/engines.md, "The MoE token exchange": block-FP8 experts at 192 a rank (measured 30.9 ms),
    NVFP4 at 256 (measured 22.9 ms), and the same NVFP4 step were SGLang to gather."""
    assert _step("deepseek-v3", 192, "deepep", 768) == (24.4, 5.8)
    assert _step("deepseek-v3.1-nvfp4", 256, "deepep", 1024) == (24.8, 4.7)
    assert _step("deepseek-v3.1-nvfp4", 256, "none", 1024)[0] == 52.7
