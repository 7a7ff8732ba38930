"""Closed loop on this machine: profile → predict → run for real, for two small models.

Why: the only way to know the empirical (profiling) model is right is to compare it with a wall
clock. For a 4-layer Llama-style model (hidden 1024) and a small Qwen3-MoE (8 experts, top-2)
this script

1. profiles the prefill step's kernels into a temporary database with the collector
   (:func:`perfcast.profiler.profile_model`, device ``cpu-local``);
2. predicts the step with ``perfcast.inference.textgen.simulate`` under the ``analytic`` and
   ``profiling`` performance models;
3. runs the same Hugging Face model for real on CPU with random weights (fp32 — this CPU has no
   native bf16 matrix unit, see ``cpu-local.yaml``; ``sdpa`` attention, eager experts,
   ``torch.no_grad()``, ``logits_to_keep=1`` so the LM head sees the last position only as in
   perfcast's capture, ``use_cache=False``), median of ``--runs`` after warm-up, in a fresh
   subprocess (so the profiling's allocator and cache state do not carry over);
4. prints predicted, measured and error % per model and performance model, and the predicted
   time per leaf kind (``--breakdown``) next to torch.profiler's measured self-CPU time by op.

Usage: ``python benchmarks/validate_cpu_local.py [--tokens 512] [--runs 5] [--engine eager]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from perfcast.hardware import get_device, load_device_file
from perfcast.inference.textgen import Request, simulate
from perfcast.models import ModelConfig
from perfcast.profiler import profile_model

LLAMA = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
         "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
MOE = {"model_type": "qwen3_moe", "hidden_size": 1024, "intermediate_size": 2816,
       "moe_intermediate_size": 704, "num_hidden_layers": 4, "num_attention_heads": 16,
       "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "num_experts": 8,
       "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
       "mlp_only_layers": [], "max_position_embeddings": 4096, "tie_word_embeddings": False}
MODELS = {"llama-4l-h1024": LLAMA, "qwen3-moe-4l-8e": MOE}


def real_forward_s(cfg: dict, tokens: int, runs: int, breakdown: bool) -> tuple[float, list[float], dict]:
    """Median wall time of the real forward (fp32, random weights), the samples, and
    torch.profiler self-CPU µs by aten op (when ``breakdown``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(cfg)
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    kwargs = {"dtype": torch.float32, "attn_implementation": "sdpa"}
    try:
        model = AutoModelForCausalLM.from_config(config, experts_implementation="eager", **kwargs)
    except (TypeError, ValueError):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    model.eval()
    ids = torch.randint(0, cfg["vocab_size"], (1, tokens))
    samples = []
    with torch.no_grad():
        for i in range(2 + runs):
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
            dt = time.perf_counter() - t0
            if i >= 2:
                samples.append(dt)
        assert out.logits.shape[1] == 1, "logits_to_keep=1 was not honoured"
        ops: dict = {}
        if breakdown:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
            for e in prof.key_averages():
                if e.self_cpu_time_total > 0:
                    ops[e.key] = e.self_cpu_time_total
    return statistics.median(samples), samples, ops


def real_in_subprocess(name: str, args) -> tuple[float, list[float], dict]:
    cmd = [sys.executable, __file__, "--real", name, "--tokens", str(args.tokens), "--runs",
           str(args.runs), "--threads", str(args.threads)] + (["--breakdown"] if args.breakdown else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc["median_s"], doc["samples_s"], doc["ops_us"]


def by_kind(result, name: str) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for lt in result.rollups[name].leaves:
        totals[lt.leaf.kind] += float(lt.time_s)
    totals["(launch)"] = float(result.rollups[name].launch_time_s)
    return dict(totals)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512, help="prefill tokens (batch 1)")
    ap.add_argument("--runs", type=int, default=5, help="timed real forwards per model")
    ap.add_argument("--repeats", type=int, default=10, help="samples per profiled kernel")
    ap.add_argument("--engine", default="eager",
                    help="engine profile whose kernels are profiled and priced (default eager: one kernel per "
                         "captured op, as the real Hugging Face forward runs them)")
    ap.add_argument("--breakdown", action="store_true", help="print per-kind predictions and profiler ops")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="torch threads for profiling and the real run (default: torch's own); "
                         "1 is steadier when another process shares the cores")
    ap.add_argument("--database", help="keep the database here (default: a temporary directory)")
    ap.add_argument("--device-file", help="device YAML for the analytic model (default: cpu-local), "
                    "e.g. one measured with tools/measure_cpu_local.py --threads 1")
    ap.add_argument("--real", metavar="MODEL", help=argparse.SUPPRESS)  # subprocess mode
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    if args.real:
        median, samples, ops = real_forward_s(MODELS[args.real], args.tokens, args.runs, args.breakdown)
        print(json.dumps({"median_s": median, "samples_s": samples, "ops_us": ops}))
        return 0
    device = load_device_file(args.device_file) if args.device_file else get_device("cpu-local")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.database or tmp)
        for name, cfg in MODELS.items():
            model = ModelConfig(name, cfg, Path(f"{name}.json"), {})
            t0 = time.perf_counter()
            db = profile_model(model, out, "cpu-local", query_length=args.tokens, dtype="fp32",
                               engine=args.engine, repeats=args.repeats)
            t1 = time.perf_counter()
            res = simulate(Request(model, device, query_length=args.tokens, dtype="fp32",
                                   performance_models=("analytic", "profiling"),
                                   profiling_database=str(db), engine=args.engine))
            real, samples, ops = real_in_subprocess(name, args)
            spread = (max(samples) - min(samples)) / real * 100
            print(f"{name}: profiled in {t1 - t0:.1f} s; real forward median {real * 1e3:.1f} ms "
                  f"over {len(samples)} runs (spread {spread:.0f} %)")
            for pm in ("analytic", "profiling"):
                ev = res.evaluations[pm]
                shares = ", ".join(f"{k} {v:.0%}" for k, v in ev.provenance_shares().items())
                rows.append((name, pm, ev.time_s, real, shares))
            if args.breakdown:
                for pm in ("analytic", "profiling"):
                    kinds = sorted(by_kind(res, pm).items(), key=lambda kv: -kv[1])
                    print(f"  predicted by kind ({pm}): " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in kinds))
                top = sorted(ops.items(), key=lambda kv: -kv[1])[:12]
                print("  measured self-CPU by op (torch.profiler, one run): "
                      + ", ".join(f"{k} {v / 1e3:.2f} ms" for k, v in top))
    print(f"\nprefill, batch 1 x {args.tokens} tokens, fp32, {args.threads} torch thread(s), cpu-local, "
          f"engine {args.engine}")
    print(f"{'model':18} {'perf model':11} {'predicted ms':>13} {'measured ms':>12} {'error %':>8}  provenance")
    worst = 0.0
    for name, pm, pred, real, shares in rows:
        err = (pred - real) / real * 100
        if pm == "profiling":
            worst = max(worst, abs(err))
        print(f"{name:18} {pm:11} {pred * 1e3:13.2f} {real * 1e3:12.2f} {err:+8.1f}  {shares}")
    print(f"\nworst profiling error: {worst:.1f} % ({'within' if worst <= 20 else 'OUTSIDE'} the 20 % target)")
    return 0 if worst <= 20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
