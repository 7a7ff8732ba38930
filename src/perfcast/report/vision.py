"""The vision encoder's part of a vision-language step: its images and tokens, its time per
performance model, its kernels and its memory, beside the language model's report."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfcast.report.format import percent, seconds, si
from perfcast.report.textgen import kernel_table, missed_ops, op_table


def _as_step(result):
    """The encoder in the shape the step tables read (rollups, evaluations, lowered graph)."""
    v = result.vision
    return SimpleNamespace(rollups=v.rollups, evaluations=v.evaluations, lowered=v.lowered, request=result.request)


def to_json(result) -> dict:
    v, req = result.vision, result.request
    doc = {"images_per_device": v.images, "encoder_tp_mode": v.mode, "tensor_parallel": v.tp,
           "image_tokens_per_sequence": req.image_tokens[0] if req.image_tokens else 0,
           "weights_bytes": v.weights_bytes, "parameters": v.parameters,
           "activation_peak_bytes": v.activation_peak_bytes, "notes": list(v.notes)}
    if not v.images:
        return doc
    im = req.images
    doc.update({"image": {"height": im.height, "width": im.width, "per_sequence": im.per_query,
                          "resized": list(v.resized), "grid_thw": list(v.grid), "tokens": v.tokens_per_image,
                          "processor": v.processor_source},
                "patches_per_device": v.patches,
                "text_tokens_per_sequence": req.query_length - req.image_tokens[0],
                "performance_models": {n: {"time_s": ev.time_s, "launch_time_s": ev.launch_time_s,
                                           "share_of_step": result.encoder_share(n),
                                           "provenance_shares": ev.provenance_shares(),
                                           "missed_ops": missed_ops(_as_step(result), n)}
                                       for n, ev in v.evaluations.items()},
                "ops": op_table(_as_step(result)), "kernels": kernel_table(_as_step(result)),
                "unknown_ops": [{"op": op, "count": n, "shapes": shapes} for (op, shapes), n in v.lowered.unknown.items()]})
    return doc


def render(console: Console, result, top: int = 15) -> None:
    doc = to_json(result)
    v = result.vision
    mem = (f"weights {si(doc['weights_bytes'], 'B')} ({doc['parameters']:,} parameters, counted in the memory above)"
           f" · peak activations {si(doc['activation_peak_bytes'], 'B')}")
    if not v.images:
        console.print(f"[bold]vision encoder[/]: no images in this step · {mem}")
        return
    im = doc["image"]
    tp = result.request.layout.tp
    layout = {"weights": f"weights split over tp {tp}", "data": f"images split over tp {tp}, full weights",
              "replicated": "replicated"}[v.mode] if tp > 1 else "one device"
    console.print(f"[bold]vision encoder[/]: {v.images} image(s) per device · {im['height']}×{im['width']} px → "
                  f"{im['resized'][0]}×{im['resized'][1]} · grid {im['grid_thw'][1]}×{im['grid_thw'][2]} patches · "
                  f"{im['tokens']:,} tokens per image ({doc['image_tokens_per_sequence']:,} per sequence, after "
                  f"{doc['text_tokens_per_sequence']:,} text tokens) · {layout} · {mem}")
    for name, m in doc["performance_models"].items():
        console.print(f"  {name}: encoder {seconds(m['time_s'])} ({percent(m['share_of_step'])} of the step) · "
                      "provenance by time: " + ", ".join(f"{k} {percent(s)}" for k, s in m["provenance_shares"].items()))
        for miss in m["missed_ops"][:5]:
            console.print(f"    [yellow]missed[/] {escape(miss['op'])} ×{miss['calls']:,} "
                          f"({seconds(miss['time_s'])} by fallback): {escape(miss['reason'])}")
    names = list(doc["performance_models"])
    t = Table(title=f"Vision encoder kernels (top {top} by time)", title_justify="left")
    for col in ("part", "kernel", "class", "fuses", "calls", *(f"time ({n})" for n in names), "share"):
        t.add_column(col, justify="right" if col in ("calls", "share") or col.startswith("time") else "left")
    for k in sorted(doc["kernels"], key=lambda k: -k["time_s"][names[0]])[:top]:
        t.add_row(escape(k["segment"]), escape(k["kernel"]), escape(str(k["class"])), escape(k["fuses"]),
                  f"{k['calls']:,}", *(seconds(k["time_s"][n]) for n in names), percent(k["share"]))
    console.print(t)
    for u in doc["unknown_ops"]:
        console.print(f"[red]vision encoder: no cost rule, NOT priced:[/] {escape(u['op'])} ×{u['count']}")
