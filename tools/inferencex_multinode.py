"""Transcribe InferenceX's multi-node (disaggregated) search spaces into perfcast's shipped table.

InferenceX (https://github.com/SemiAnalysisAI/InferenceX, Apache-2.0) launches its disaggregated
runs from ``.github/configs/nvidia-master.yaml``: each ``multinode: true`` config key lists, per
input / output length, search-space entries of a concurrency list, a prefill and a decode worker
pool (``num-worker``, ``tp``, ``ep``, ``dp-attn``) and ``spec-decoding`` (``mtp`` or none). A row of
silicon_sample.csv measured by such a run states its lengths, concurrency, container image and day,
but not whether MTP ran, and most rows not how many workers. This tool walks the file's history up
to a cutoff day and writes every distinct entry once, with the day it first appeared (the day its
commit landed) and the day of
the first commit that no longer had it (``until``, empty if it was still there at the cutoff), so
that :mod:`perfcast.inference.multinode` can find the entries in force when a row was measured.

Where an entry runs an NVIDIA/srt-slurm recipe (``CONFIG_FILE``, ``--recipes``), the recipe's engine settings
are added; where it names none but its launch script runs Dynamo's TensorRT-LLM performance sweeps (GB200's
DeepSeek-R1 NVFP4 to 2026-01-30 and gpt-oss-120b), the settings those sweeps write from the entry's
``DECODE_*`` settings are (:func:`sweep`), with the script as the ``launcher``.

Run (a clone of InferenceX with its history):

    .venv/bin/python tools/inferencex_multinode.py --repo PATH [--until 2026-04-27]

It rewrites ``src/perfcast/data/validation/inferencex_multinode.csv`` and prints the commit range;
the data files' MANIFEST.yaml records it.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import yaml

CONFIG = ".github/configs/nvidia-master.yaml"
OUT = Path(__file__).resolve().parent.parent / "src/perfcast/data/validation/inferencex_multinode.csv"
POOL = ("workers", "tp", "ep", "dp_attn")
#: what the srt-slurm recipe of an entry states: the clients its benchmark runs, and per worker pool the
#: KV-cache dtype and MoE backend (TensorRT-LLM: trtllm_config.{prefill,decode} kv_cache_config.dtype,
#: moe_config.backend; SGLang: sglang_config.{prefill,decode} kv-cache-dtype, moe-runner-backend) and SGLang's
#: MoE all-to-all backend (moe-a2a-backend; empty: SGLang's default, none); the recipe's commit
RECIPE = ("recipe_commit", "recipe_concurrencies", "prefill_kv_cache_dtype", "prefill_moe_backend", "prefill_moe_a2a",
          "decode_kv_cache_dtype", "decode_moe_backend", "decode_moe_a2a", "decode_max_batch_size",
          "decode_cuda_graph_max")
COLUMNS = ("config_key", "runner", "framework", "model", "precision", "image", "isl", "osl", "spec_decoding",
           "concurrencies", *(f"prefill_{k}" for k in POOL), *(f"decode_{k}" for k in POOL), "config_file",
           "first", "first_commit", "until", *RECIPE, "launcher")
#: the decode pool's additional settings an entry without a recipe passes to its launch script (kept with the
#: entry, so that a change of them starts a new span; not written: the launcher's limits are)
DECODE_SETTINGS = ("DECODE_MAX_BATCH_SIZE", "DECODE_MAX_NUM_TOKENS")
#: where Dynamo's TensorRT-LLM performance sweeps live in ai-dynamo/dynamo
SWEEPS = "components/backends/trtllm/performance_sweeps"


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def pool(p: dict) -> tuple:
    return (p.get("num-worker"), p.get("tp"), p.get("ep"), bool(p.get("dp-attn")))


def config_file(p: dict) -> str:
    for s in p.get("additional-settings") or ():
        if str(s).startswith("CONFIG_FILE="):
            return str(s).split("=", 1)[1]
    return ""


def recipe(repo: str, branch: str, path: str, day: str, cache: dict) -> dict:
    """The RECIPE columns of an srt-slurm recipe as the branch had it on ``day`` (empty where the
    file is not there)."""
    commit = git(repo, "rev-list", "-1", f"--before={day}T23:59:59", branch).strip()
    if not commit or (commit, path) in cache:
        return cache.get((commit, path), {})
    try:
        doc = yaml.safe_load(git(repo, "show", f"{commit}:{path}")) or {}
    except (subprocess.CalledProcessError, yaml.YAMLError):
        doc = None
    out = {}
    if isinstance(doc, dict):
        concs = str((doc.get("benchmark") or {}).get("concurrencies") or "")
        backend = doc.get("backend") or {}
        trt, sgl = backend.get("trtllm_config") or {}, backend.get("sglang_config") or {}
        out = {"recipe_commit": commit[:11],
               "recipe_concurrencies": " ".join(re.findall(r"\d+", concs))}  # "576", ['2048'], "4x8x16"
        for pre in ("prefill", "decode"):
            t, g = trt.get(pre) or {}, sgl.get(pre) or {}
            # TensorRT-LLM: kv_cache_config.dtype, moe_config.backend; SGLang: --kv-cache-dtype (fp8_e4m3 is
            # perfcast's fp8), --moe-runner-backend
            kv = str((t.get("kv_cache_config") or {}).get("dtype") or g.get("kv-cache-dtype") or "")
            out[f"{pre}_kv_cache_dtype"] = "fp8" if kv.startswith("fp8") else kv
            out[f"{pre}_moe_backend"] = str((t.get("moe_config") or {}).get("backend") or g.get("moe-runner-backend") or "")
            # SGLang's MoE all-to-all backend: --moe-a2a-backend (--enable-deepep-moe before it), SGLang's
            # default none where the recipe's SGLang section sets neither
            a2a = g.get("moe-a2a-backend") or ("deepep" if g.get("enable-deepep-moe") in (True, "true", "True") else "")
            out[f"{pre}_moe_a2a"] = str(a2a or ("none" if g else ""))
        out["decode_max_batch_size"], out["decode_cuda_graph_max"] = _limits(trt.get("decode") or {},
                                                                              sgl.get("decode") or {})
    cache[(commit, path)] = out
    return out


def _limits(t: dict, g: dict) -> tuple[str, str]:
    """A decode pool's batch limit per attention-DP rank and its largest CUDA graph ("" where the
    recipe leaves the engine's default; "0": no graphs). TensorRT-LLM: max_batch_size;
    cuda_graph_config null (none), else the largest of its batch_sizes or its max_batch_size
    (llm_args.py CudaGraphConfig: 128 where neither is given). SGLang: --cuda-graph-max-bs (or the
    largest of --cuda-graph-bs), --disable-cuda-graph; its --max-running-requests is the server's,
    not a rank's, and is not read."""
    batch = str(t.get("max_batch_size") or "")
    if "cuda_graph_config" in t:
        cg = t["cuda_graph_config"]
        graph = "0" if cg is None else str(max(cg.get("batch_sizes") or [cg.get("max_batch_size") or 128]))
    elif g.get("disable-cuda-graph") in (True, "true", "True"):
        graph = "0"
    else:
        sizes = g.get("cuda-graph-bs")
        sizes = [int(s) for s in re.findall(r"\d+", str(sizes))] if sizes else []
        graph = str(max(sizes)) if sizes else str(g.get("cuda-graph-max-bs") or "")
    return batch, graph


def settings(p: dict) -> dict[str, str]:
    """A pool's ``additional-settings`` (``KEY=VALUE`` strings) as a dict."""
    return dict(str(s).split("=", 1) for s in p.get("additional-settings") or () if "=" in str(s))


def sweep(repo: str, row: dict, day: str, cache: dict) -> dict:
    """The RECIPE columns and the launcher of an entry without an srt-slurm recipe whose InferenceX launch
    script (``benchmarks/[multi_node/]<prefix>_<precision>_<runner>_<framework>[_slurm].sh`` on ``day``)
    runs Dynamo's TensorRT-LLM performance sweeps; empty for any other.

    The script checks out a branch of ai-dynamo/dynamo and passes the entry's ``DECODE_MAX_BATCH_SIZE`` and
    ``DECODE_MAX_NUM_TOKENS`` to ``benchmark_disagg.slurm`` as ``gen_batch_size`` and ``gen_max_num_tokens``,
    whose ``scripts/gen_yaml.py`` writes the decode workers' TensorRT-LLM config (every version the public
    index holds, 2025-2026): ``max_batch_size: gen_batch_size``, ``max_num_tokens: gen_max_num_tokens``,
    ``cuda_graph_config: {enable_padding: true, batch_sizes: [1, 2, 4, ..., 2048, gen_batch_size]}``,
    ``kv_cache_config.dtype: fp8`` (prefill too) and ``moe_config.backend`` TRTLLM without attention DP,
    CUTLASS with it below 16 GPUs, WIDEEP from 16 (GB200). TensorRT-LLM keeps the graphs up to
    ``min(max_batch_size, max_num_tokens)`` for a plain decode (``_filter_cuda_graph_batch_sizes``, padding to
    that size), which is also the most sequences one step can decode, so both limits are that minimum."""
    batch = row.get("_decode", {}).get("DECODE_MAX_BATCH_SIZE")
    if row["config_file"] or row["framework"] != "dynamo-trt" or not batch:
        return {}

    def runs_sweeps(path: str, commit: str, text: str) -> dict:
        branch = re.search(r"git checkout (\S+)", text)
        if SWEEPS in text and "DECODE_MAX_BATCH_SIZE" in text and branch:
            return {"launcher": f"InferenceX {path} at {commit}: ai-dynamo/dynamo {branch.group(1)} "
                                f"{SWEEPS}/scripts/gen_yaml.py"}
        return {}

    found = launch_script(repo, row, day, cache, runs_sweeps)
    if not found:
        return {}
    tokens = row["_decode"].get("DECODE_MAX_NUM_TOKENS")
    limit = str(min(int(batch), int(tokens)) if tokens else int(batch))
    moe = "TRTLLM" if not row["decode_dp_attn"] else ("WIDEEP" if int(row["decode_tp"]) >= 16 else "CUTLASS")
    return {**found, "prefill_kv_cache_dtype": "fp8", "decode_kv_cache_dtype": "fp8",
            "decode_moe_backend": moe, "decode_max_batch_size": limit, "decode_cuda_graph_max": limit}


#: where Dynamo's SGLang Slurm jobs live in ai-dynamo/dynamo
SGLANG_JOBS = "components/backends/sglang/slurm_jobs"


def sglang_jobs(repo: str, row: dict, day: str, cache: dict) -> dict:
    """The launcher and the decode workers' MoE all-to-all backend of an SGLang entry without an srt-slurm recipe
    whose InferenceX launch script (``benchmarks/[multi_node/]<prefix>_<precision>_<runner>_<framework>[_slurm].sh``
    on ``day``) runs Dynamo's SGLang Slurm jobs; empty for any other.

    The script checks out a commit of ai-dynamo/dynamo (b7107d00 in every version, "All configs are frozen in this
    branch") and runs ``slurm_jobs/submit_disagg.sh`` with ``GPU_TYPE`` gb200-fp4 or gb200-fp8, whose workers start
    from ``slurm_jobs/scripts/<GPU_TYPE>.sh``. That commit is not in the public index; every stored version of those
    two scripts whose decode command is written out runs its decode workers with DeepEP's low-latency all-to-all
    (``--moe-a2a-backend deepep --deepep-mode low_latency``, gb200-fp4.sh; ``--enable-deepep-moe --deepep-mode
    low_latency``, gb200-fp8.sh), which is what the column says."""
    if row["config_file"] or row["framework"] != "dynamo-sglang":
        return {}

    def runs_jobs(path: str, commit: str, text: str) -> dict:
        pinned = re.search(r"git checkout ([0-9a-f]{40})", text)
        gpu = re.search(r'GPU_TYPE="(gb200-fp[48])"', text)
        if "SGL_SLURM_JOBS_PATH" in text and "submit_disagg.sh" in text and pinned and gpu:
            return {"launcher": f"InferenceX {path} at {commit}: ai-dynamo/dynamo {pinned.group(1)[:11]} "
                                f"{SGLANG_JOBS}/scripts/{gpu.group(1)}.sh", "decode_moe_a2a": "deepep"}
        return {}

    return launch_script(repo, row, day, cache, runs_jobs)


def launch_script(repo: str, row: dict, day: str, cache: dict, read) -> dict:
    """``read(path, commit, text)`` of the entry's InferenceX launch script as it stood on ``day``
    (``benchmarks/[multi_node/]<prefix>_<precision>_<runner>_<framework>[_slurm].sh``), once per commit and
    script; empty where there is none or it says nothing ``read`` knows."""
    commit = git(repo, "rev-list", "-1", f"--before={day}T23:59:59", "HEAD").strip()
    name = f"{row['_prefix']}_{row['precision']}_{row['runner']}_{row['framework']}"
    if (commit, name) not in cache:
        found = {}
        for path in git(repo, "ls-tree", "-r", "--name-only", commit, "benchmarks/").split():
            if Path(path).name in (f"{name}.sh", f"{name}_slurm.sh"):
                found = read(path, commit[:11], git(repo, "show", f"{commit}:{path}")) or found
        cache[(commit, name)] = found
    return cache[(commit, name)]


def entries(doc: dict):
    """(key of the entry, its row) of every multi-node search-space entry of one version."""
    for key, cfg in doc.items():
        if not isinstance(cfg, dict) or not cfg.get("multinode"):
            continue
        for lengths in cfg.get("seq-len-configs") or ():
            for ss in lengths.get("search-space") or ():
                if "conc-list" in ss:
                    concs = list(ss["conc-list"])
                else:  # conc-start … conc-end doubles (.github/workflows: generate_sweep_configs)
                    concs, c = [], ss.get("conc-start")
                    while c and c <= ss.get("conc-end", 0):
                        concs.append(c)
                        c *= 2
                p, d = ss.get("prefill") or {}, ss.get("decode") or {}
                row = {"config_key": key, "runner": cfg.get("runner"), "framework": cfg.get("framework"),
                       "model": cfg.get("model"), "precision": cfg.get("precision"),
                       "image": str(cfg.get("image") or "").replace("#", "/"),  # as silicon.image_of reads it
                       "isl": lengths.get("isl"), "osl": lengths.get("osl"),
                       "spec_decoding": ss.get("spec-decoding") or "none",
                       "concurrencies": " ".join(str(c) for c in concs),
                       **{f"prefill_{k}": v for k, v in zip(POOL, pool(p))},
                       **{f"decode_{k}": v for k, v in zip(POOL, pool(d))},
                       "config_file": config_file(p) or config_file(d), "_prefix": cfg.get("model-prefix")}
                # the launch-script settings of an entry without a recipe (one with a recipe takes them from it)
                row["_decode"] = {} if row["config_file"] else {k: v for k, v in settings(d).items()
                                                                if k in DECODE_SETTINGS}
                yield tuple(v for k, v in row.items() if not k.startswith("_")) + tuple(sorted(row["_decode"].items())), row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repo", required=True, help="a clone of SemiAnalysisAI/InferenceX with its history")
    ap.add_argument("--until", default="2026-04-27", help="the last day of history read (YYYY-MM-DD)")
    ap.add_argument("--out", default=str(OUT), help="the table written (default: the shipped one)")
    ap.add_argument("--recipes", help="a clone of NVIDIA/srt-slurm with its history: each entry's recipe "
                    "(CONFIG_FILE) as the branch had it on the entry's last day in force")
    ap.add_argument("--recipes-branch", default="sa-submission-q2-2026")
    args = ap.parse_args(argv)
    log = git(args.repo, "log", "--reverse", "--format=%H %cd", "--date=short", "--", CONFIG).split("\n")
    commits = [line.split() for line in log if line and line.split()[1] <= args.until]
    if not commits:
        sys.exit(f"inferencex_multinode: no commit of {CONFIG} on or before {args.until} in {args.repo}")
    seen: dict[tuple, dict] = {}  # the open span of each entry
    spans: list[dict] = []  # every span, open or closed
    for commit, day in commits:
        doc = yaml.safe_load(git(args.repo, "show", f"{commit}:{CONFIG}")) or {}
        now = dict(entries(doc))
        for key, row in now.items():
            if key not in seen:  # new, or back after a removal: a new span
                seen[key] = {**row, "first": day, "first_commit": commit[:11], "until": ""}
                spans.append(seen[key])
        for key in [k for k in seen if k not in now]:
            seen.pop(key)["until"] = day
    cache: dict = {}
    for row in spans if args.recipes else ():
        if row["config_file"] and ":" not in row["config_file"]:
            row.update(recipe(args.recipes, args.recipes_branch, row["config_file"], row["until"] or args.until,
                              cache))
    launchers: dict = {}
    for row in spans:  # the launch script as it stood on the entry's last day in force
        last = (date.fromisoformat(row["until"]) - timedelta(days=1)).isoformat() if row["until"] else args.until
        row.update(sweep(args.repo, row, max(last, row["first"]), launchers))
        row.update(sglang_jobs(args.repo, row, max(last, row["first"]), launchers))
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for row in sorted(spans, key=lambda r: (r["config_key"], r["isl"], r["osl"], r["first"],
                                                         r["spec_decoding"], r["concurrencies"])):
            w.writerow(row)
    print(f"{Path(args.out).name}: {len(spans)} entries from {len(commits)} commits of {CONFIG}, "
          f"{commits[0][0][:11]} ({commits[0][1]}) .. {commits[-1][0][:11]} ({commits[-1][1]})")


if __name__ == "__main__":
    main()
