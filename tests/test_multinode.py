"""Disaggregated InferenceX rows read against the campaign's multi-node configs
(``inferencex_multinode.csv``, ``perfcast.inference.multinode``): rows only MTP entries can have
measured are not priced, rows MTP and plain entries both can have are labelled, and rows that do
not say how many workers they ran take the workers and layouts of the one deployment that ran them."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from perfcast.inference import multinode, silicon
from perfcast.ir.errors import UserError
from silicon_rows import case

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post2"
# DeepSeek-R1 NVFP4 disaggregated on GB200 under Dynamo + TensorRT-LLM, as InferenceX's dated result
# files state it: the prefill and decode workers' tp (the decode pool's ep and attention DP garbled:
# moe_tp 8 × moe_ep 4), no worker counts, no decode batch
DATED = dict(model_path="deepseek-ai/DeepSeek-R1", system="gb200", precision="fp4", mode="disagg",
             gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", backend_version="0.8.1.post2", isl="1024",
             osl="8192", batch_size="", tp_size="", moe_tp_size="", moe_ep_size="", attention_dp_size="",
             prefill_tp_size="4", prefill_pp_size="1", prefill_attention_dp_size="1", prefill_moe_tp_size="1",
             prefill_moe_ep_size="4", decode_tp_size="32", decode_pp_size="1", decode_attention_dp_size="1",
             decode_moe_tp_size="8", decode_moe_ep_size="4", image=IMAGE, measured="2026-03-23")


def test_the_shipped_table_reads_and_holds_both_kinds_of_entry():
    entries = multinode.entries()
    assert len(entries) > 700
    assert {e.mtp for e in entries} == {True, False}
    assert {e.model_path for e in entries} <= set(multinode.MODELS.values())
    assert all(e.first <= (e.until or "9999") and e.concurrencies for e in entries)
    assert all(e.framework in multinode.FRAMEWORKS.values() for e in entries)


def test_an_entrys_spec_decoding_agrees_with_its_recipes_name():
    """Where the srt-slurm recipe an entry runs names its speculation (``/mtp/`` or ``mtp1``…``mtp3``
    against ``/stp/`` or ``mtp0``), it says what the entry's ``spec-decoding`` says."""
    import re

    named = [(e.mtp, bool(re.search(r"/mtp/|mtp[1-9]", e.config_file))) for e in multinode.entries()
             if re.search(r"/mtp/|mtp[0-9]|/stp/", e.config_file)]
    assert len(named) > 600 and all(mtp == says for mtp, says in named)


def test_a_row_without_workers_takes_the_one_deployment_that_ran_it():
    c = case(**DATED, concurrency="2048")
    assert c.predictable, c.reason
    assert silicon.ONE_DECODE_WORKER not in c.approximate
    # ctx1_gen1_dep32_batch64: one decode worker of 32 attention-DP ranks, 2048 / 32 = 64 each
    assert (c.layout.tp, c.layout.dp, c.layout.ep, c.layout.attention_dp, c.batch) == (1, 32, 32, True, 64)
    assert (c.prefill_workers, c.decode_workers) == (1, 1)
    assert (c.prefill_layout.dp, c.prefill_layout.ep) == (4, 4)
    note = next(n for n in c.notes if n.startswith(multinode.WORKERS_NOTE))
    assert "prefill 1 × (tp 4, ep 4, attention DP), decode 1 × (tp 32, ep 32, attention DP)" in note
    assert "ctx1_gen1_dep32_batch64_eplb0_mtp0.yaml" in note and multinode.TABLE in note


def test_a_row_takes_its_recipes_decode_settings_where_perfcast_prices_them():
    frame, _ = silicon.read()
    rows = {r["id"]: r for r in frame.to_dict("records")}
    # B200, DeepSeek-R1 FP8, one decode worker of TP 8: the recipe's decode workers ran the TRTLLM MoE backend
    b = silicon.map_row(rows["2026_03_25_deepseek_r1_b200_sxm_trtllm_fp8_disagg_8192x1024_c1_tp8_0_ep1_0_358"])
    assert b.predictable and b.kv_dtype == "fp8" and b.engine_options == (("moe_backend", "TRTLLM"),)
    note = next(n for n in b.notes if n.startswith(multinode.RECIPE_NOTE))
    assert "KV cache fp8, MoE backend TRTLLM (recipes/trtllm/b200-fp8/" in note and "NVIDIA/srt-slurm" in note
    # GB200 DEP32: CuTe DSL MoE, which the TensorRT-LLM profile does not price — its default stays, said
    g = case(**DATED, concurrency="2048")
    assert g.kv_dtype == "fp8" and g.engine_options == ()
    assert any("MoE backend CUTEDSL, which perfcast's trtllm profile does not price" in n for n in g.notes)
    # SGLang: --kv-cache-dtype fp8_e4m3 (perfcast's fp8) on GB300; on GB200 a FlashInfer MoE runner too,
    # which is not an option of the SGLang profile
    # and the DEP32 decode workers' DeepEP all-to-all (--moe-a2a-backend deepep), an option of the SGLang profile
    s = silicon.map_row(rows["dsr1_gb300_sglang_fp8_disagg_8192x1024_c128_cfg505"])
    assert s.predictable and s.kv_dtype == "fp8" and s.engine_options == (("moe_a2a_backend", "deepep"),)
    assert any(n.startswith(f"{multinode.RECIPE_NOTE}: decode workers' KV cache fp8, MoE all-to-all deepep "
                            "(recipes/gb300-fp8/") for n in s.notes)
    f = silicon.map_row(rows["dsr1_gb200_sglang_fp4_disagg_1024x1024_c4_cfg486"])
    assert any("MoE backend flashinfer_trtllm, which perfcast's sglang profile does not price" in n for n in f.notes)
    # a recipe that sets no all-to-all backend leaves SGLang's default (none: the MoE group gathers its tokens)
    assert f.engine_options == () and any("MoE all-to-all none (the engine's default)" in n for n in f.notes)


def test_a_row_takes_its_recipes_decode_batch_limit_and_cuda_graphs():
    frame, _ = silicon.read()
    rows = {r["id"]: r for r in frame.to_dict("records")}
    # B200 DeepSeek-R1 NVFP4, two DEP8 decode workers at 2,192 clients: 137 a rank by the concurrency, but the
    # recipe's decode workers run at most 128 (max_batch_size) and capture graphs up to 128 (cuda_graph_config)
    c = silicon.map_row(rows["dsr1_b200_trtllm_fp4_disagg_1024x1024_c2192_cfg346"])
    assert c.predictable and (c.batch, c.cuda_graph_max) == (128, 128)
    note = next(n for n in c.notes if n.startswith(multinode.LIMITS_NOTE))
    assert "batch limit 128 per rank (the row's 137 capped), CUDA graphs up to 128 sequences" in note
    assert "recipes/trtllm/b200-fp4/1k1k/stp/ctx1_gen2_dep8_batch128_eplb0_mtp0.yaml" in note
    # the step it prices is a graph replay: the engine's default (128) would have run a 137-sequence batch eagerly
    from perfcast.inference.steps import case_request

    assert case_request(c, decode=True).profile().launch.decode.capture_limit("b200-sxm") == 128
    # an aggregated row takes nothing from the multi-node recipes
    a = silicon.map_row(rows["minimaxm2_5_b300_vllm_fp8_agg_8192x1024_c4_cfg733"])
    assert a.cuda_graph_max is None and not any(n.startswith(multinode.LIMITS_NOTE) for n in a.notes)


@pytest.mark.parametrize("trt, sgl, want", [
    ({"max_batch_size": 64, "cuda_graph_config": None}, {}, ("64", "0")),
    ({"cuda_graph_config": {"enable_padding": True, "batch_sizes": [1, 2, 58, 64]}}, {}, ("", "64")),
    ({"cuda_graph_config": {"max_batch_size": 256}}, {}, ("", "256")),
    ({"cuda_graph_config": {}}, {}, ("", "128")),          # neither given: TensorRT-LLM's default 128
    ({}, {"cuda-graph-max-bs": 512}, ("", "512")),
    ({}, {"cuda-graph-bs": "1 2 4 96"}, ("", "96")),
    ({}, {"disable-cuda-graph": True, "max-running-requests": 512}, ("", "0")),   # the server's, not a rank's
    ({}, {}, ("", "")),
])
def test_the_tool_reads_a_decode_pools_batch_limit_and_cuda_graphs(trt, sgl, want):
    assert _tool()._limits(trt, sgl) == want


def test_a_row_only_mtp_entries_can_have_measured_is_not_priced():
    c = case(**{**DATED, "decode_tp_size": "16", "decode_moe_tp_size": "4"}, concurrency="6144")
    assert not c.predictable
    assert c.reason.startswith("ran speculative decoding, MTP in every entry of the campaign's multi-node configs "
                               "that can have measured it (concurrency 6144, 2026-03-23: dsr1-fp4-gb200-dynamo-trt")
    assert "acceptance rate" in c.reason and multinode.TABLE in c.reason


def test_a_row_either_kind_of_entry_can_have_measured_is_priced_as_the_plain_one_and_labelled():
    c = case(**DATED, concurrency="8192")
    assert c.predictable, c.reason
    label = next(a for a in c.approximate if a.startswith(multinode.EITHER_NOTE))
    assert "both with MTP" in label and "priced as the plain one" in label
    assert any(n.startswith(multinode.WORKERS_NOTE) for n in c.notes)
    from perfcast.inference.validation import _strictly

    strict = _strictly(c)  # perfcast validate --strict
    assert not strict.predictable and strict.reason.startswith("approximate mapping refused (--strict)")


@pytest.mark.parametrize("change", [dict(measured="2025-06-01"), dict(image="lmsysorg/sglang:v0.5.8"),
                                    dict(concurrency="2047"), dict(decode_tp_size="64", decode_moe_tp_size="16"),
                                    dict(system="b200_sxm")])
def test_a_row_no_entry_matches_keeps_the_one_worker_assumption(change):
    c = case(**{**DATED, "concurrency": "2048", **change})
    assert silicon.ONE_DECODE_WORKER in c.approximate
    assert not any(n.startswith(multinode.WORKERS_NOTE) for n in c.notes)


def test_stated_workers_are_kept_and_must_agree_with_the_entry():
    stated = {**DATED, "backend": "trtllm", "benchmark": "inferencex", "concurrency": "2048",
              "prefill_num_workers": "1", "decode_num_workers": "1"}
    assert multinode.candidates(stated)
    assert not multinode.candidates({**stated, "decode_num_workers": "2"})
    r = multinode.resolve(stated)
    assert (r.row, r.reason, r.note) == (stated, None, None)  # the row's own layout stands


@pytest.mark.parametrize("column", ["decode_tp_size", "prefill_num_workers", "concurrency"])
def test_a_malformed_row_column_is_one_line_naming_it(column):
    # the config is read before the layout: its reading of the row's columns says what is wrong as the
    # layout's does, never a traceback
    with pytest.raises(UserError, match=rf"row r: column {column}: 'abc' is not a number"):
        case(**{**DATED, "concurrency": "2048", column: "abc"})


@pytest.mark.parametrize("change", [dict(mode="agg"), dict(benchmark="gap-analysis")])
def test_only_disaggregated_inferencex_rows_are_read(change):
    row = {**DATED, "concurrency": "8192", **change}
    assert multinode.resolve(row) == multinode.Resolution(row)


def test_a_malformed_table_is_one_line_naming_the_file_and_line(tmp_path):
    good = (ROOT / "src/perfcast/data/validation" / multinode.TABLE).read_text().splitlines()
    fields = good[1].split(",")
    fields[6] = "10x24"  # isl
    bad = tmp_path / "t.csv"
    bad.write_text("\n".join([good[0], ",".join(fields)]) + "\n")
    with pytest.raises(UserError, match=r"t\.csv: line 2: .*expected the columns tools/inferencex_multinode\.py"):
        multinode.read(bad)


def _tool():
    spec = importlib.util.spec_from_file_location("inferencex_multinode", ROOT / "tools/inferencex_multinode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _commit(repo: Path, day: str, text: str, path: str = ".github/configs/nvidia-master.yaml") -> None:
    cfg = repo / path
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(text)
    env = {"GIT_AUTHOR_DATE": f"{day}T12:00:00", "GIT_COMMITTER_DATE": f"{day}T12:00:00", "HOME": str(repo),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", day], check=True, env=env)


CONFIG = """
dsr1-fp4-gb200-dynamo-trt:
  image: nvcr.io#nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post2
  model: nvidia/DeepSeek-R1-0528-NVFP4-v2
  precision: fp4
  runner: gb200
  framework: dynamo-trt
  multinode: true
  seq-len-configs:
  - isl: 1024
    osl: 1024
    search-space:
{entries}
single-node:
  image: x
  seq-len-configs: []
"""
MTP = """    - spec-decoding: "mtp"
      conc-list: [4, 8]
      prefill: {num-worker: 1, tp: 4, ep: 4, dp-attn: true, additional-settings: ["CONFIG_FILE=recipes/a.yaml"]}
      decode: {num-worker: 4, tp: 8, ep: 8, dp-attn: false}"""
PLAIN = """    - conc-start: 4
      conc-end: 16
      prefill: {num-worker: 1, tp: 4, ep: 4, dp-attn: true}
      decode: {num-worker: 1, tp: 32, ep: 32, dp-attn: true}"""


RECIPE = """
benchmark: {concurrencies: "4x8x12"}
backend:
  trtllm_config:
    prefill: {kv_cache_config: {dtype: fp8}, moe_config: {backend: TRTLLM}}
    decode: {kv_cache_config: {dtype: fp8}, moe_config: {backend: CUTLASS}}
"""


def _recipes(tmp_path: Path) -> Path:
    repo = tmp_path / "srt"
    subprocess.run(["git", "init", "-q", "-b", "sa-submission-q2-2026", str(repo)], check=True)
    (repo / "recipes").mkdir()
    _commit(repo, "2026-01-03", RECIPE, "recipes/a.yaml")
    _commit(repo, "2026-01-20", RECIPE.replace("CUTLASS", "TRTLLM"), "recipes/a.yaml")  # after the entry's last day
    return repo


def test_the_tool_writes_each_entry_with_the_days_it_was_in_force(tmp_path):
    repo = tmp_path / "ix"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "2026-01-01", CONFIG.format(entries=MTP))
    _commit(repo, "2026-01-05", CONFIG.format(entries=MTP + "\n" + PLAIN))
    _commit(repo, "2026-01-09", CONFIG.format(entries=PLAIN))
    _commit(repo, "2026-02-01", CONFIG.format(entries=MTP))  # beyond --until: not read
    out = tmp_path / "t.csv"
    _tool().main(["--repo", str(repo), "--until", "2026-01-31", "--out", str(out), "--recipes", str(_recipes(tmp_path))])
    mtp, plain = multinode.read(out)
    # the recipe as the branch had it on the entry's last day (2026-01-09), not after
    assert (sorted(mtp.recipe_concurrencies), mtp.kv_cache_dtype, mtp.moe_backend) == ([4, 8, 12], "fp8", "CUTLASS")
    assert plain.recipe_commit == "" and plain.recipe_concurrencies == frozenset()  # it names no recipe
    assert (mtp.mtp, sorted(mtp.concurrencies), mtp.first, mtp.until) == (True, [4, 8], "2026-01-01", "2026-01-09")
    assert mtp.config_file == "recipes/a.yaml" and mtp.image == IMAGE  # '#' read as '/'
    assert (mtp.prefill, mtp.decode) == (multinode.Pool(1, 4, 4, True), multinode.Pool(4, 8, 8, False))
    assert (plain.mtp, sorted(plain.concurrencies), plain.first, plain.until) == (False, [4, 8, 16], "2026-01-05", "")


SWEEP_CONFIG = """
gptoss-fp4-gb200-dynamo-trt:
  image: nvcr.io#nvidia/ai-dynamo/tensorrtllm-runtime:0.7.0.post2
  model: openai/gpt-oss-120b
  model-prefix: gptoss
  precision: fp4
  runner: gb200
  framework: dynamo-trt
  multinode: true
  seq-len-configs:
  - isl: 8192
    osl: 1024
    search-space:
    - conc-list: [128, 512]
      prefill: {num-worker: 1, tp: 1, ep: 1, dp-attn: false, additional-settings: ["PREFILL_MAX_BATCH_SIZE=32"]}
      decode: {num-worker: 1, tp: 4, ep: 1, dp-attn: false,
               additional-settings: ["DECODE_MAX_NUM_TOKENS=20000", "DECODE_MAX_BATCH_SIZE=1024"]}
    - conc-list: [2048]
      prefill: {num-worker: 1, tp: 1, ep: 1, dp-attn: false}
      decode: {num-worker: 1, tp: 16, ep: 16, dp-attn: true,
               additional-settings: ["DECODE_MAX_NUM_TOKENS=256", "DECODE_MAX_BATCH_SIZE=512"]}
"""
SWEEP_SCRIPT = """
git clone https://github.com/ai-dynamo/dynamo.git
cd dynamo
git checkout release/0.5.1-rc0.20260105
cd components/backends/trtllm/performance_sweeps
sbatch benchmark_disagg.slurm ${DECODE_TP} ${DECODE_EP} ${DECODE_MAX_BATCH_SIZE} ${DECODE_MAX_NUM_TOKENS}
"""


def test_the_tool_reads_an_entry_without_a_recipe_from_the_dynamo_sweep_its_script_runs(tmp_path):
    """An entry without an srt-slurm recipe whose launch script runs Dynamo's TensorRT-LLM performance
    sweeps takes the decode settings ``gen_yaml.py`` writes from its DECODE_* settings: both limits
    min(batch, tokens), KV cache fp8, the MoE backend by attention DP and size; a change of the settings is a
    new span; an entry whose script runs something else takes nothing."""
    repo = tmp_path / "ix"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _commit(repo, "2026-01-07", SWEEP_SCRIPT, "benchmarks/multi_node/gptoss_fp4_gb200_dynamo-trt.sh")
    _commit(repo, "2026-01-08", SWEEP_CONFIG)
    _commit(repo, "2026-01-20", SWEEP_CONFIG.replace("DECODE_MAX_BATCH_SIZE=1024", "DECODE_MAX_BATCH_SIZE=768"))
    out = tmp_path / "t.csv"
    _tool().main(["--repo", str(repo), "--until", "2026-01-31", "--out", str(out)])
    tep, dep, later = sorted(multinode.read(out), key=lambda e: (e.first, e.decode.tp))
    launcher = ("InferenceX benchmarks/multi_node/gptoss_fp4_gb200_dynamo-trt.sh at ")
    assert tep.launcher.startswith(launcher) and "ai-dynamo/dynamo release/0.5.1-rc0.20260105 " in tep.launcher
    assert (tep.max_batch, tep.cuda_graph, tep.kv_cache_dtype, tep.moe_backend) == (1024, 1024, "fp8", "TRTLLM")
    assert (dep.max_batch, dep.cuda_graph, dep.moe_backend) == (256, 256, "WIDEEP")  # min(512, 256 tokens)
    assert (tep.first, tep.until, later.first, later.max_batch) == ("2026-01-08", "2026-01-20", "2026-01-20", 768)
    assert tep.settings_source() == tep.launcher
    # the same entries launched by a script that does not run the sweeps: no settings
    _commit(repo, "2026-01-25", "python3 launch.py\n", "benchmarks/multi_node/gptoss_fp4_gb200_dynamo-trt.sh")
    _tool().main(["--repo", str(repo), "--until", "2026-01-31", "--out", str(out)])
    assert [(e.launcher, e.max_batch) for e in multinode.read(out) if not e.until] == [("", None)] * 2


def test_a_gb200_gpt_oss_row_decodes_within_the_graphs_its_sweep_captured():
    """InferenceX's gpt-oss-120b GB200 disaggregated runs have no srt-slurm recipe: their decode workers'
    batch limit and CUDA graphs come from the Dynamo sweep the launch script runs (DECODE_MAX_BATCH_SIZE
    1024 for one TP 4 worker at 512 clients), so the 512-sequence step is a graph replay, not the eager
    step past TensorRT-LLM's default 128 graphs it was priced as."""
    frame, _ = silicon.read()
    rows = {r["id"]: r for r in frame.to_dict("records")}
    c = silicon.map_row(rows["2026_04_06_gpt_oss_120b_gb200_trtllm_fp4_disagg_8192x1024_c512_tp1_ep1_1235"])
    assert c.predictable and (c.batch, c.cuda_graph_max, c.kv_dtype) == (512, 1024, "fp8")
    assert c.engine_options == (("moe_backend", "TRTLLM"),)  # gen_yaml.py: no attention DP
    note = next(n for n in c.notes if n.startswith(multinode.LIMITS_NOTE))
    assert "batch limit 1024 per rank, CUDA graphs up to 1024 sequences" in note
    assert "benchmarks/multi_node/gptoss_fp4_gb200_dynamo-trt.sh" in note and "gen_yaml.py" in note
    from perfcast.inference.steps import case_request

    assert case_request(c, decode=True).profile().launch.decode.capture_limit("gb200") == 1024


def test_a_row_measured_before_its_configuration_was_merged_takes_the_configuration_as_merged():
    """Kimi-K2.5's GB200 TensorRT-LLM runs of 2026-04-02: no entry was in force (the configuration reached
    the campaign's main branch on 2026-04-18, #1026), so the row takes the entries merged then — within
    MERGED_DAYS — labelled approximate; a row whose only later entries are beyond the window, or whose
    image differs, takes none."""
    frame, _ = silicon.read()
    rows = {r["id"]: r for r in frame.to_dict("records")}
    row = rows["2026_03_25_kimi_k2_5_gb200_trtllm_fp4_disagg_1024x1024_c192_tp8_0_ep_176"]
    clean = {k: ("" if v != v else str(v)) for k, v in row.items()}
    assert multinode._matching(clean, in_force=True) == ()
    later = multinode.merged_later(clean)
    assert later and {e.first for e in later} == {"2026-04-18"}
    c = silicon.map_row(row)
    assert c.predictable and (c.layout.tp, c.layout.ep, c.batch) == (8, 8, 48)  # 192 over four TP 8 workers
    assert silicon.ONE_DECODE_WORKER not in c.approximate
    label = next(a for a in c.approximate if a.startswith(multinode.MERGED_NOTE))
    assert "in force on 2026-04-02" in label and "merged on 2026-04-18" in label
    assert multinode.merged_later({**clean, "measured": "2026-03-01"}) == ()  # 48 days before: none
    assert multinode.merged_later({**clean, "image": "nvcr.io/other:1"}) == ()


def test_entries_that_agree_on_the_decode_pool_alone_give_the_decode_workers():
    """DeepSeek-R1 FP8 on H200 at 288 clients: the two entries that can have measured it run the same
    nine TEP 8 decode workers (the same recipe, c32_ctx1_gen9_tep8) behind different prefill pools. The
    decode step depends on the decode pool alone, so the row takes it — 288 / 9 = 32 sequences a worker,
    not one worker holding all 288 — and keeps its own prefill columns."""
    frame, _ = silicon.read()
    rows = {r["id"]: r for r in frame.to_dict("records")}
    c = silicon.map_row(rows["2026_03_25_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c288_tp8_0_ep8_0_353"])
    assert c.predictable and silicon.ONE_DECODE_WORKER not in c.approximate
    assert (c.layout.tp, c.layout.ep, c.layout.attention_dp, c.batch, c.decode_workers) == (8, 8, False, 32, 9)
    note = next(n for n in c.notes if n.startswith(multinode.WORKERS_NOTE))
    assert note.startswith(f"{multinode.WORKERS_NOTE}: decode 9 × (tp 8, ep 8) (")
    assert "differ in their prefill pools (1 × (tp 8, ep 8), 1 × (tp 8, ep 8, attention DP))" in note
    assert c.prefill_workers is None  # the row states none, and the entries disagree


def test_the_shipped_table_is_the_one_its_manifest_describes():
    import hashlib

    from perfcast.inference import silicon_file

    m = silicon_file.manifest()["inferencex_multinode"]
    path = ROOT / "src/perfcast/data/validation" / m["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m["sha256"]
    assert len(path.read_text().splitlines()) - 1 == m["entries"]


def test_the_shipped_copy_reads_the_same_rows_as_the_docs_say():
    """docs/design/validation.md, "The campaign's multi-node configs": 300 rows not priced, 428 labelled,
    807 given their workers (29 of them by a configuration merged after the run, 53 their decode pool
    alone), by system and backend."""
    from collections import Counter

    frame, _ = silicon.read()
    cases = {c.id: c for c in silicon.map_frame(frame[frame["mode"] == "disagg"])}
    mtp, either, workers, merged, decode = Counter(), Counter(), Counter(), Counter(), Counter()
    for row in frame[frame["mode"] == "disagg"].to_dict("records"):
        c, k = cases[row["id"]], (row["system"], row["backend"])
        mtp[k] += (c.reason or "").startswith("ran speculative decoding, MTP in every entry")
        either[k] += any(a.startswith(multinode.EITHER_NOTE) for a in c.approximate)
        workers[k] += any(n.startswith(multinode.WORKERS_NOTE) for n in c.notes)
        merged[k] += any(a.startswith(multinode.MERGED_NOTE) for a in c.approximate) or multinode.MERGED_NOTE in (c.reason or "")
        decode[k] += any(n.startswith(multinode.WORKERS_NOTE) and "differ in their prefill pools" in n for n in c.notes)
    assert +mtp == {("b200_sxm", "sglang"): 27, ("b200_sxm", "trtllm"): 69, ("b300_sxm", "trtllm"): 53,
                    ("gb200", "trtllm"): 61, ("gb300", "trtllm"): 58, ("h100_sxm", "sglang"): 2,
                    ("h100_sxm", "trtllm"): 8, ("h200_sxm", "sglang"): 4, ("h200_sxm", "trtllm"): 18}
    assert sum(either.values()) == 428 and sum(workers.values()) == 807
    assert +workers == {("b200_sxm", "sglang"): 77, ("b200_sxm", "trtllm"): 92, ("b300_sxm", "trtllm"): 71,
                        ("gb200", "sglang"): 96, ("gb200", "trtllm"): 169, ("gb300", "sglang"): 64,
                        ("gb300", "trtllm"): 96, ("h100_sxm", "sglang"): 8, ("h100_sxm", "trtllm"): 38,
                        ("h200_sxm", "sglang"): 27, ("h200_sxm", "trtllm"): 69}
    assert +decode == {("b200_sxm", "sglang"): 11, ("b200_sxm", "trtllm"): 10, ("gb200", "sglang"): 4,
                       ("h200_sxm", "sglang"): 3, ("h200_sxm", "trtllm"): 25}
    assert +merged == {("gb200", "trtllm"): 25, ("h200_sxm", "trtllm"): 4}
