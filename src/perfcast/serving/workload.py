"""What the benchmark client sends: request lengths, arrivals, and the warm-up it discards.

Three ways to send:

- closed loop at ``concurrency`` C, as ``vllm bench serve --max-concurrency`` and AIPerf's
  concurrency mode run: C clients start at t = 0, each sends its next request the moment its
  previous one completes;
- open loop at ``rate`` requests/s: Poisson arrivals (``cv`` 1), or gamma-distributed gaps of
  coefficient of variation ``cv`` (vLLM ``benchmark_serving.py --burstiness`` = 1 / cv²);
- a trace (CSV or JSONL): ``arrival_s`` (or ``timestamp`` in ms, the Mooncake trace format),
  ``input_length``, ``output_length``, optional ``hash_ids`` (prompt block hashes for prefix
  reuse); replayed at its own times, or in closed loop if ``concurrency`` is given.

Lengths are a fixed number or a distribution spec: ``1024``, ``uniform:512-1536``,
``normal:1024,128`` (optionally ``normal:1024,128,512-1536`` to clip), ``lognormal:1024,0.5`` (mean
and sigma of the log). All draws come from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfcast.inputs import checked_number, read_text
from perfcast.ir.errors import UserError

#: tokens per hash block in the Mooncake traces (FAST'25 "Mooncake", trace README: block size 512)
MOONCAKE_HASH_BLOCK_TOKENS = 512
#: the share of an open-loop run discarded as warm-up when not stated
OPEN_LOOP_WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class Lengths:
    """A token-length distribution: ``fixed`` (a), ``uniform`` (a..b), ``normal`` (mean a, std b),
    ``lognormal`` (mean a, sigma of the log b); draws are clipped to ``lo..hi`` and rounded."""

    kind: str
    a: float
    b: float = 0.0
    lo: int = 1
    hi: int = 2**31 - 1

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "fixed":
            x = np.full(n, self.a)
        elif self.kind == "uniform":
            x = rng.integers(int(self.a), int(self.b) + 1, size=n)
        elif self.kind == "normal":
            x = rng.normal(self.a, self.b, size=n)
        else:  # lognormal with the stated mean
            x = rng.lognormal(math.log(self.a) - self.b**2 / 2, self.b, size=n)
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a


def parse_lengths(spec: str | int, name: str) -> Lengths:
    """A length spec as the user typed it for flag ``name``; a bad one is one line naming it."""
    if isinstance(spec, int):
        return Lengths("fixed", checked_number(spec, name, integer=True, positive=True))
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    try:
        if not rest:
            return Lengths("fixed", _positive_int(kind, name))
        if kind == "uniform":
            lo, hi = (_positive_int(v, name) for v in rest.split("-"))
            if lo > hi:
                raise ValueError
            return Lengths("uniform", lo, hi, lo, hi)
        if kind in ("normal", "lognormal"):
            parts = rest.split(",")
            mean, spread = float(parts[0]), float(parts[1])
            lo, hi = (_positive_int(v, name) for v in parts[2].split("-")) if len(parts) == 3 else (1, 2**31 - 1)
            if len(parts) > 3 or not (math.isfinite(mean) and mean > 0 and math.isfinite(spread) and spread >= 0):
                raise ValueError
            return Lengths(kind, mean, spread, lo, hi)
    except (ValueError, IndexError):
        pass
    raise UserError(f"{name}: expected a token count or fixed:N, uniform:LO-HI, normal:MEAN,STD[,LO-HI] or "
                    f"lognormal:MEAN,SIGMA, got {text[:40]!r}")


def _positive_int(text: str, name: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


@dataclass(frozen=True)
class Trace:
    """Requests read from a trace file: arrival seconds (from 0), lengths, prompt hash blocks."""

    arrival_s: tuple[float, ...]
    input_length: tuple[int, ...]
    output_length: tuple[int, ...]
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    source: str = ""


@dataclass(frozen=True)
class Workload:
    """A benchmark run: ``num_requests`` requests in closed loop (``concurrency``), open loop
    (``rate``, ``cv``) or from a ``trace``. ``warmup`` requests (default: the first
    ``concurrency`` in closed loop, the first 10 % in open loop) are simulated but not counted.
    ``prefix_hit_rate``: the share of each prompt's full blocks found cached."""

    input_len: Lengths = Lengths("fixed", 1024)
    output_len: Lengths = Lengths("fixed", 256)
    num_requests: int = 1000
    concurrency: int | None = None
    rate: float | None = None
    cv: float = 1.0
    trace: Trace | None = None
    warmup: int | None = None
    seed: int = 0
    prefix_hit_rate: float = 0.0
    hash_block_tokens: int = MOONCAKE_HASH_BLOCK_TOKENS

    def __post_init__(self):
        checked_number(self.num_requests, "--num-requests", integer=True, positive=True)
        if self.concurrency is None and self.rate is None and self.trace is None:
            raise UserError("workload: give --concurrency (closed loop), --request-rate or --trace (open loop)")
        if self.concurrency is not None and self.rate is not None:
            raise UserError("workload: give --concurrency (closed loop) or --request-rate (open loop), not both")
        if self.concurrency is not None:
            checked_number(self.concurrency, "--concurrency", integer=True, positive=True)
        if self.rate is not None:
            checked_number(self.rate, "--request-rate", positive=True)
        checked_number(self.cv, "--cv", positive=True)
        checked_number(self.prefix_hit_rate, "--prefix-hit-rate", minimum=0, maximum=1)
        checked_number(self.hash_block_tokens, "--hash-block-tokens", integer=True, positive=True)
        if self.warmup is not None:
            checked_number(self.warmup, "--warmup", integer=True, minimum=0, maximum=self.num_requests - 1)

    @property
    def closed_loop(self) -> bool:
        return self.concurrency is not None

    def warmup_count(self) -> int:
        if self.warmup is not None:
            return self.warmup
        if self.closed_loop:
            return min(self.concurrency, self.num_requests - 1)
        return int(self.num_requests * OPEN_LOOP_WARMUP_FRACTION)


@dataclass(frozen=True)
class Requests:
    """The generated requests, in send order. ``arrival_s`` NaN: sent by a closed-loop client."""

    arrival_s: np.ndarray
    input_length: np.ndarray
    output_length: np.ndarray
    hash_ids: tuple[tuple[int, ...], ...] | None
    warmup: int


def generate(w: Workload) -> Requests:
    """The requests of ``w``, deterministic for its seed."""
    rng = np.random.default_rng(w.seed)
    n = w.num_requests
    if w.trace is not None:
        t = w.trace
        if len(t.arrival_s) < n:
            raise UserError(f"--num-requests: {n} but the trace {t.source} has {len(t.arrival_s)} requests")
        isl, osl = np.array(t.input_length[:n], np.int64), np.array(t.output_length[:n], np.int64)
        arrival = np.array(t.arrival_s[:n], float)
        hashes = t.hash_ids[:n] if t.hash_ids is not None else None
    else:
        isl, osl = w.input_len.sample(rng, n), w.output_len.sample(rng, n)
        arrival = _arrivals(rng, n, w.rate, w.cv) if w.rate is not None else np.zeros(n)
        hashes = None
    if w.closed_loop:
        arrival = np.full(n, np.nan)
    return Requests(arrival, isl, osl, hashes, w.warmup_count())


def _arrivals(rng: np.random.Generator, n: int, rate: float, cv: float) -> np.ndarray:
    """Arrival times from t = 0: gamma gaps of mean 1/rate and coefficient of variation ``cv``
    (shape 1/cv²; cv 1 is exponential, i.e. Poisson arrivals — vLLM benchmark_serving.py
    get_request draws np.random.gamma(shape=burstiness, scale=1/(rate·burstiness)))."""
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


# -- trace files ----------------------------------------------------------------------------------

def read_trace(path: str | Path) -> Trace:
    """A trace file (``.csv``, or JSON lines otherwise); every bad row or value is one line naming
    the file, the line and the key."""
    text = read_text(path)
    rows = _csv_rows(text, path) if str(path).lower().endswith(".csv") else _jsonl_rows(text, path)
    if not rows:
        raise UserError(f"{path}: no requests in the trace")
    arrivals, isl, osl, hashes = [], [], [], []
    for line, row in rows:
        where = f"{path}: line {line}"
        if "arrival_s" in row:
            arrivals.append(checked_number(_num(row["arrival_s"]), f"{where}: key 'arrival_s'", minimum=0))
        elif "timestamp" in row:
            ms = checked_number(_num(row["timestamp"]), f"{where}: key 'timestamp'", minimum=0)
            arrivals.append(ms / 1000.0)
        else:
            raise UserError(f"{where}: missing key 'arrival_s' (or 'timestamp' in ms)")
        for key, out in (("input_length", isl), ("output_length", osl)):
            if key not in row:
                raise UserError(f"{where}: missing key {key!r}")
            out.append(checked_number(_num(row[key]), f"{where}: key {key!r}", integer=True, positive=True))
        hashes.append(_hashes(row.get("hash_ids"), where))
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
    t0 = arrivals[order[0]]
    has_hashes = any(h for h in hashes)
    return Trace(tuple(arrivals[i] - t0 for i in order), tuple(isl[i] for i in order), tuple(osl[i] for i in order),
                 tuple(hashes[i] for i in order) if has_hashes else None, str(path))


def _num(value):
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def _hashes(value, where: str) -> tuple[int, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise UserError(f"{where}: key 'hash_ids': expected a list of integers, got {value[:40]!r}") from None
    if not isinstance(value, list):
        raise UserError(f"{where}: key 'hash_ids': expected a list of integers")
    return tuple(checked_number(h, f"{where}: key 'hash_ids'", integer=True) for h in value)


def _csv_rows(text: str, path) -> list[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise UserError(f"{path}: an empty CSV file; expected a header row")
    rows = []
    for row in reader:
        if None in row:
            raise UserError(f"{path}: line {reader.line_num}: more values than the header has columns")
        rows.append((reader.line_num, {k.strip(): (v.strip() if v is not None else "") for k, v in row.items()}))
    return rows


def _jsonl_rows(text: str, path) -> list[tuple[int, dict]]:
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise UserError(f"{path}: line {line_no}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}: line {line_no}: expected a JSON object")
        rows.append((line_no, row))
    return rows
