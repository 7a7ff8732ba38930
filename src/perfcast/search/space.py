"""The design space of ``perfcast optimize``: every deployment of a model on a device budget.

An aggregated candidate is one engine instance's layout, replicated over the budget (the
replicas are the deployment's data parallelism: each serves its share of the clients), and the
instance's batch limit. Layouts of an instance of ``s`` devices (``s`` a power of two dividing
the budget, as the engines' TP/EP groups are):

- dense models: ``tp = s``, and ``tp × pp = s`` with ``pp`` of 2 or more (aggregated: a step is
  one cycle of the pipeline's batches in flight, :mod:`perfcast.serving.step_pipeline`; as a pool
  of a disaggregated candidate refused as "not modelled" — the search does not pair pipelines);
- mixture-of-experts models: ``tp × dp = s`` with attention data parallelism when ``dp > 1``
  (TensorRT-LLM ``enable_attention_dp``, SGLang ``--enable-dp-attention``, vLLM
  ``--data-parallel-size`` with expert parallelism), and every expert-parallel size ``ep``
  dividing the MoE group (``moe_tp = s / ep`` inside each expert).

A layout the model cannot take (heads not divisible, experts not divisible) is kept as a
candidate and rejected as "invalid layout" with the reason, so that every point the space holds
is accounted for.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfcast.capture.parallel import Layout, experts_of

#: Batch limits searched by default (sequences in flight per engine instance rank).
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


@dataclass(frozen=True)
class Candidate:
    """One point of the space: ``mode`` agg (``replicas`` instances of ``layout``) or disagg
    (``prefill_instances`` of ``prefill_layout`` handing over to ``decode_instances`` of
    ``layout``); ``batch``: the decode instances' batch limit per rank; ``max_num_tokens``: the
    step's token budget searched (None: the search's single budget, else the engine's)."""

    mode: str
    device: str
    quantize: str | None
    layout: Layout
    batch: int
    replicas: int = 1
    prefill_layout: Layout | None = None
    prefill_instances: int = 0
    decode_instances: int = 0
    max_num_tokens: int | None = None

    @property
    def devices(self) -> int:
        if self.mode == "disagg":
            return (self.prefill_instances * self.prefill_layout.num_devices
                    + self.decode_instances * self.layout.num_devices)
        return self.replicas * self.layout.num_devices

    @property
    def concurrency(self) -> int:
        """Clients in flight over the whole deployment (aggregated: every rank's batch full)."""
        return self.batch * self.layout.dp * (self.replicas if self.mode == "agg" else self.decode_instances)

    def short(self) -> str:
        """A table cell: ``agg 4×tp2 b64``, ``disagg 4×tp1 → 2×tp2 b128``."""
        q = (f" t{self.max_num_tokens}" if self.max_num_tokens else "") + (f" {self.quantize}" if self.quantize else "")
        if self.mode == "disagg":
            return (f"disagg {self.prefill_instances}×{compact(self.prefill_layout)} → "
                    f"{self.decode_instances}×{compact(self.layout)} b{self.batch}{q}")
        return f"agg {self.replicas}×{compact(self.layout)} b{self.batch}{q}"

    def describe(self) -> str:
        q = f" {self.quantize}" if self.quantize else ""
        t = f", max num tokens {self.max_num_tokens}" if self.max_num_tokens else ""
        if self.mode == "disagg":
            return (f"{self.device}{q} disagg {self.prefill_instances} × ({self.prefill_layout.describe()}) prefill → "
                    f"{self.decode_instances} × ({self.layout.describe()}) decode, batch {self.batch}{t}")
        return f"{self.device}{q} {self.replicas} × ({self.layout.describe()}) batch {self.batch}{t}"


#: ``h100-sxm@hbm_bandwidth=1.5,matrix_rate=2``: a device under hardware what-if multipliers
#: (:func:`perfcast.hardware.device.scaled`) — a design point of the space, not a part one can buy.
WHAT_IF_MARK = "@"


def variant(device: str, what_if: dict[str, float]) -> str:
    """The space's name of ``device`` under ``what_if`` (the device itself when there is none)."""
    if not what_if:
        return device
    return device + WHAT_IF_MARK + ",".join(f"{k}={v:g}" for k, v in sorted(what_if.items()))


def parse_variant(name: str) -> tuple[str, tuple[tuple[str, float], ...]]:
    """``(device, what-if multipliers)`` of a space's device name."""
    device, _, rest = name.partition(WHAT_IF_MARK)
    pairs = []
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        pairs.append((k, float(v)))
    return device, tuple(sorted(pairs))


def compact(lay: Layout) -> str:
    """``tp2``, ``tp1ep8dp8a`` (a: attention data parallelism), ``tp2pp2``."""
    out = f"tp{lay.tp}" + (f"ep{lay.ep}" if lay.ep > 1 else "") + (f"dp{lay.dp}" if lay.dp > 1 else "")
    return out + ("a" if lay.attention_dp else "") + (f"pp{lay.pp}" if lay.pp > 1 else "")


def instance_layouts(cfg: dict, size: int) -> list[Layout]:
    """Every layout of one engine instance of ``size`` devices (see the module docstring)."""
    if not experts_of(cfg):
        out = [Layout(tp=size)]
        out += [Layout(tp=size // pp, pp=pp) for pp in powers_of_two(size)[1:]]
        return out
    out = []
    for dp in powers_of_two(size):
        tp = size // dp
        for ep in powers_of_two(size):
            out.append(Layout(tp=tp, ep=ep, dp=dp, attention_dp=dp > 1))
    return out


def layouts(cfg: dict, budget: int, sizes: tuple[int, ...] | None = None) -> list[Layout]:
    """Instance layouts of every size in ``sizes`` (default: the powers of two dividing ``budget``)."""
    sizes = sizes or tuple(s for s in powers_of_two(budget) if budget % s == 0)
    return [lay for s in sizes for lay in instance_layouts(cfg, s)]
