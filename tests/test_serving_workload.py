"""Workload generation, trace files (one-line errors), and the metric summaries."""

import numpy as np
import pytest

from perfcast.ir.errors import UserError
from perfcast.serving.metrics import summarize, weighted_summary
from perfcast.serving.scheduler import scheduler_config
from perfcast.serving.workload import Lengths, Workload, generate, parse_lengths, read_trace


def test_length_specs():
    assert parse_lengths("1024", "--isl") == Lengths("fixed", 1024)
    assert parse_lengths("uniform:512-1536", "--isl") == Lengths("uniform", 512, 1536, 512, 1536)
    assert parse_lengths("normal:1024,128", "--isl").kind == "normal"
    x = parse_lengths("normal:1024,128,900-1100", "--isl").sample(np.random.default_rng(0), 1000)
    assert x.min() >= 900 and x.max() <= 1100
    y = parse_lengths("lognormal:1000,0.5", "--osl").sample(np.random.default_rng(0), 20000)
    assert y.mean() == pytest.approx(1000, rel=0.03)
    for bad in ("uniform:9-3", "normal:1024", "zipf:3", "-5", "0"):
        with pytest.raises(UserError, match="^--isl: expected a token count"):
            parse_lengths(bad, "--isl")


def test_generation_is_deterministic_and_gamma_gaps_have_the_cv():
    w = Workload(num_requests=20000, rate=10.0, cv=2.0, seed=7)
    a, b = generate(w), generate(w)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    gaps = np.diff(a.arrival_s)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.08)
    assert a.warmup == 2000
    closed = generate(Workload(num_requests=10, concurrency=4))
    assert np.isnan(closed.arrival_s).all() and closed.warmup == 4


def test_workload_needs_one_way_to_send():
    with pytest.raises(UserError, match="^workload: give --concurrency"):
        Workload(num_requests=10)
    with pytest.raises(UserError, match="not both"):
        Workload(num_requests=10, concurrency=2, rate=1.0)


def test_trace_files(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,input_length,output_length\n0.5,100,10\n0.0,200,20\n")
    t = read_trace(csv)
    assert t.arrival_s == (0.0, 0.5) and t.input_length == (200, 100) and t.hash_ids is None
    jl = tmp_path / "m.jsonl"
    jl.write_text('{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
                  '{"timestamp": 3000, "input_length": 700, "output_length": 6, "hash_ids": [1, 3]}\n')
    m = read_trace(jl)
    assert m.arrival_s == (0.0, 2.0) and m.hash_ids == ((1, 2), (1, 3))


@pytest.mark.parametrize("name,text,message", [
    ("a.csv", "arrival_s,input_length,output_length\n0,abc,3\n", r"a.csv: line 2: key 'input_length': expected an integer"),
    ("b.csv", "arrival_s,output_length\n0,3\n", r"b.csv: line 2: missing key 'input_length'"),
    ("c.jsonl", '{"arrival_s": 0, "input_length": 5, "output_length": 1}\n{oops\n', r"c.jsonl: line 2: not JSON"),
    ("d.jsonl", '{"arrival_s": -1, "input_length": 5, "output_length": 1}\n', r"d.jsonl: line 1: key 'arrival_s': expected at least 0"),
    ("e.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 0}\n', r"e.jsonl: line 1: key 'output_length': expected a positive"),
    ("f.jsonl", '{"arrival_s": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n', r"f.jsonl: line 1: key 'hash_ids'"),
])
def test_trace_errors_are_one_line(tmp_path, name, text, message):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(UserError, match=message) as err:
        read_trace(p)
    assert "\n" not in str(err.value)


def test_weighted_summary_equals_percentiles_of_the_repeated_values():
    rng = np.random.default_rng(1)
    v, w = rng.random(50), rng.integers(0, 7, 50)
    s = weighted_summary(v, w)
    ref = summarize(np.repeat(v, w))
    assert s.as_dict() == pytest.approx(ref.as_dict(), rel=1e-12)


def test_scheduler_defaults_come_from_the_profiles():
    v, s, t = (scheduler_config(e) for e in ("vllm", "sglang", "trtllm"))
    assert (v.block_size, v.max_num_tokens, v.preemption, v.admission) == (16, 8192, "recompute", "on_demand")
    assert (s.block_size, s.mixed_chunk, s.preemption, s.admission) == (1, False, "retract", "reserve_ratio")
    assert (t.block_size, t.chunked_prefill, t.preemption, t.admission) == (32, False, "never", "reserve_full")
    assert scheduler_config("vllm", max_batch_size=8, chunked_prefill=False).max_num_seqs == 8
    with pytest.raises(UserError, match="^--max-batch-size: expected a positive"):
        scheduler_config("vllm", max_batch_size=0)
    with pytest.raises(UserError, match="has no 'scheduler' section"):
        scheduler_config("xla")
