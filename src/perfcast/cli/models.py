"""``perfcast models``: the shipped model catalog (reads JSON only; no torch)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from perfcast.models import catalog_names, load_model_config, vision
from perfcast.report.document import check, emit


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the shipped model configs")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    rows = []
    for name in catalog_names():
        m = load_model_config(name)
        d = vision.language_model(m).data if vision.is_vision_language(m) else m.data  # a VLM's decoder
        experts = d.get("num_local_experts") or d.get("num_experts") or d.get("n_routed_experts")
        rows.append({"name": name, "model_type": m.model_type, "layers": d.get("num_hidden_layers"),
                     "hidden_size": d.get("hidden_size"), "heads": d.get("num_attention_heads"),
                     "kv_heads": d.get("num_key_value_heads"), "experts": experts,
                     "experts_per_token": d.get("num_experts_per_tok") if experts else None,
                     "hf_repo": m.source.get("hf_repo"), "license": m.source.get("license")})
    if args.json:
        return emit({"models": rows})
    check(rows)
    t = Table(title="Models")
    for col in ("name", "type", "layers", "hidden", "heads/kv", "experts", "source", "license"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["model_type"], str(r["layers"]), str(r["hidden_size"]),
                  f"{r['heads']}/{r['kv_heads']}",
                  f"{r['experts']} (top {r['experts_per_token']})" if r["experts"] else "—",
                  r["hf_repo"] or "", r["license"] or "")
    Console(width=max(140, Console().width)).print(t)
    return 0
