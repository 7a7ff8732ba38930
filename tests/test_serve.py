"""``perfcast serve``: the application and the CLI on a real model (Llama-3.1-8B on an H100)."""

import json

import pytest

from perfcast.capture.parallel import Layout
from perfcast.cli.main import main
from perfcast.serving.serve import Disagg, ServeSpec, serve
from perfcast.serving.step import Deployment
from perfcast.serving.workload import Lengths, Workload

LLAMA = Deployment("llama-3.1-8b", "h100-sxm", "vllm")


def _w(**kw):
    base = dict(input_len=Lengths("uniform", 800, 1200), output_len=Lengths("uniform", 48, 80), num_requests=160)
    return Workload(**{**base, **kw})


def test_both_tiers_agree_on_tpot_and_throughput_in_a_desynchronised_closed_loop():
    rep = serve(ServeSpec(LLAMA, _w(concurrency=16)))
    a = rep.agreement()
    assert a["tpot_s"] == pytest.approx(1, abs=0.12)
    assert a["output_tokens_per_s"] == pytest.approx(1, abs=0.12)
    sim = rep.results["simulation"]
    # the closed-loop identity, measured on the simulation's own counted requests
    assert 16 / sim.requests_per_s == pytest.approx(sim.e2e_s.mean, rel=0.15)


def test_data_parallel_ranks_split_the_load_and_add_their_throughput():
    one = serve(ServeSpec(LLAMA, _w(concurrency=8), tier="simulation")).results["simulation"]
    two = serve(ServeSpec(Deployment("llama-3.1-8b", "h100-sxm", "vllm", Layout(dp=2)), _w(concurrency=16,
                                                                                         num_requests=320),
                          tier="simulation")).results["simulation"]
    assert two.devices == 2 * one.devices
    assert two.output_tokens_per_s == pytest.approx(2 * one.output_tokens_per_s, rel=1e-9)
    assert two.tpot_s.mean == pytest.approx(one.tpot_s.mean, rel=1e-9)


def test_max_load_is_at_least_the_throughput_of_a_small_closed_loop():
    small = serve(ServeSpec(LLAMA, _w(concurrency=4), tier="simulation")).results["simulation"]
    full = serve(ServeSpec(LLAMA, _w(concurrency=4), tier="simulation", max_load=True)).results["simulation"]
    assert full.output_tokens_per_s > 3 * small.output_tokens_per_s


def test_prefix_hits_shorten_the_time_to_first_token():
    cold = serve(ServeSpec(LLAMA, _w(rate=4.0), tier="simulation")).results["simulation"]
    warm = serve(ServeSpec(LLAMA, _w(rate=4.0, prefix_hit_rate=0.75), tier="simulation")).results["simulation"]
    assert warm.ttft_s.mean < 0.6 * cold.ttft_s.mean


def test_an_overloaded_rate_is_unstable_with_the_rate_it_sustains():
    rep = serve(ServeSpec(LLAMA, _w(rate=500.0, num_requests=300)))
    for r in rep.results.values():
        assert not r.stable and r.ttft_s is None and r.tpot_s is None
        assert 0 < r.sustainable_rate < 500


def test_disaggregated_pools_count_both_pools_devices():
    rep = serve(ServeSpec(LLAMA, _w(rate=2.0), disagg=Disagg(LLAMA, 1, 2)))
    assert rep.results["simulation"].devices == 3
    assert rep.disagg["kv_transfer"]["tier"] == "nvlink"
    assert rep.results["closed form"].devices == 3


def _cli(capsys, *argv):
    code = main(["serve", "llama-3.1-8b", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_prints_the_serve_document(capsys, tmp_path):
    trace = tmp_path / "t.json"
    code, out, _ = _cli(capsys, "--concurrency", "4", "--num-requests", "20", "--osl", "16", "--json",
                        "--chrome-trace", str(trace))
    assert code == 0
    doc = json.loads(out)
    assert {"ttft_s", "tpot_s", "itl_s", "e2e_s", "throughput", "kv_cache"} <= doc.keys()
    assert set(doc["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "X"} >= {"prefill", "decode"}


@pytest.mark.parametrize("argv, processes", [
    ((), {0: "engine 0"}),
    (("--disagg", "1p2d"), {0: "prefill 0", 1: "decode 0", 2: "decode 1"}),
])
def test_the_serve_trace_has_a_track_per_instance_a_span_per_phase_and_counters(capsys, tmp_path, argv, processes):
    trace = tmp_path / "t.json"
    code, _, err = _cli(capsys, "--request-rate", "4", "--num-requests", "12", "--osl", "8", "--tier", "simulation",
                        "--chrome-trace", str(trace), *argv)
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    # one process per engine instance, named and ordered; every event on one of them
    assert {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"} == processes
    assert {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"} == \
        {pid: pid for pid in processes}
    assert {e["pid"] for e in events} == set(processes)
    spans = [e for e in events if e["ph"] == "X"]
    # a thread per request on each instance that ran part of it, named for the request
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in spans} == set(threads)
    assert all(threads[e["pid"], e["tid"]] == f"request {e['args']['request']}" for e in spans)
    assert {e["args"]["request"] for e in spans} == set(range(12))
    phases = {"queued", "prefill", "decode"} | ({"transfer"} if argv else set())
    assert phases <= {e["name"] for e in spans} <= phases | {"transfer queued"}
    assert all(e["dur"] >= 0 and e["cat"] == "request" for e in spans)
    # every request prefilled once and decoded once, in that order
    first = {(e["args"]["request"], e["name"]): e for e in spans}
    assert all(first[i, "prefill"]["ts"] + first[i, "prefill"]["dur"] <= first[i, "decode"]["ts"] + 1e-6
               for i in range(12))
    counters = [e for e in events if e["ph"] == "C"]
    # the batch size and the KV tokens in use, on every instance that ran a step
    assert {(e["pid"], e["name"], *e["args"]) for e in counters} == \
        {(pid, name, key) for pid in processes for name, key in (("batch", "sequences"), ("kv", "tokens"))}
    assert max(e["args"]["sequences"] for e in counters if e["name"] == "batch") >= 1


@pytest.mark.parametrize("argv, says", [
    ((), "give a load"),
    (("--concurrency", "2", "--acceptance", "0.5"), "--acceptance: applies with --speculative"),
    (("--concurrency", "2", "--speculative", "mtp:2"), "needs --acceptance"),
    (("--concurrency", "2", "--speculative", "mtp:2", "--acceptance", "0.5"), "2 probabilities"),
    (("--concurrency", "2", "--speculative", "lookahead:2", "--acceptance", "0.5"), "expected mtp:K"),
    (("--concurrency", "2", "--disagg", "2x3"), "expected XpYd"),
    (("--concurrency", "2", "--pp-size", "2", "--engine", "trtllm", "--isl", "9000", "--tier", "closed-form"),
     "exceeds max_num_tokens 8192"),   # one prompt runs in one batch, whatever the cycle's budget
    (("--concurrency", "2", "--cv", "2"), "--cv"),
    (("--concurrency", "2", "--attention-dp"), "--attention-dp"),
    (("--concurrency", "3", "--dp-size", "2"), "does not split evenly"),
    (("--concurrency", "2", "--isl", "uniform:9-3"), "--isl"),
    (("--concurrency", "2", "--isl", "300000", "--kv-capacity", "100000"), "can never fit"),
    (("--concurrency", "2", "--disagg", "auto:4"), "--disagg auto"),
])
def test_bad_flags_are_one_line_and_exit_2(capsys, argv, says):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == ""
    assert says in err and len(err.strip().splitlines()) == 1


def test_a_trace_is_replayed_by_the_simulation(capsys, tmp_path):
    trace = tmp_path / "requests.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 500, "output_length": 20, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 100, "input_length": 700, "output_length": 10, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 250, "input_length": 600, "output_length": 30, "hash_ids": [1, 3]}\n')
    code, out, err = _cli(capsys, "--trace", str(trace), "--warmup", "0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc["tiers"]) == ["simulation"] and doc["workload"]["load"]["kind"] == "trace"
    assert doc["throughput"]["requests_per_s"] > 0
    code, out, err = _cli(capsys, "--trace", str(trace), "--tier", "closed-form")
    assert code == 2 and "not a trace" in err


def test_the_cli_max_load_queues_every_request_at_the_start(capsys):
    code, out, err = _cli(capsys, "--max-load", "--num-requests", "64", "--osl", "16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["workload"]["load"] == {"kind": "max-load", "requests_queued_at_start": 64}
    assert doc["throughput"]["output_tokens_per_s"] > 0


@pytest.mark.parametrize("device, budget", [("h200-sxm", 8192), ("b200-sxm", 16384)])
def test_sglang_s_step_budget_is_the_one_it_picks_for_the_device(capsys, device, budget):
    # SGLang's chunked_prefill_size by the GPU's memory (engines/profiles/sglang.yaml), aggregated
    # and disaggregated
    for extra in ((), ("--disagg", "1p1d")):
        code, out, _ = _cli(capsys, "--device", device, "--engine", "sglang", "--concurrency", "2",
                            "--num-requests", "6", "--osl", "8", "--json", *extra)
        assert code == 0
        assert json.loads(out)["scheduler"]["max_num_tokens"] == budget, extra


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_the_closed_form_s_first_wave_is_the_simulation_s(engine):
    # C = N = 16 clients sent at t = 0 with warm-up 0: every counted request is in the first wave, which
    # the closed form schedules step by step as the engine does (serving/meanfield_burst.py)
    w = Workload(input_len=Lengths("fixed", 1024), output_len=Lengths("fixed", 64), num_requests=16,
                 concurrency=16, warmup=0)
    rep = serve(ServeSpec(Deployment("llama-3.1-8b", "h100-sxm", engine), w, max_num_tokens=4096))
    sim, cf = rep.results["simulation"].ttft_s, rep.results["closed form"].ttft_s
    assert (cf.mean, cf.p50, cf.p90, cf.p99) == pytest.approx((sim.mean, sim.p50, sim.p90, sim.p99), rel=1e-4)
    assert any(n.startswith("TTFT: the first wave counted") for n in rep.results["closed form"].notes)
    steady = serve(ServeSpec(Deployment("llama-3.1-8b", "h100-sxm", engine), Workload(
        input_len=Lengths("fixed", 1024), output_len=Lengths("fixed", 64), num_requests=32, concurrency=16),
        max_num_tokens=4096, tier="closed-form")).results["closed form"]   # (default warm-up: the first wave)
    assert not any(n.startswith("TTFT: the first wave") for n in steady.notes)


def test_the_closed_form_is_the_steady_state_unless_a_warm_up_below_c_is_given():
    # the search prices a closed-form point with N = C requests (the default warm-up then counts the last
    # one): that is the steady state, not the first wave's last request
    w = dict(input_len=Lengths("fixed", 1024), output_len=Lengths("fixed", 64), concurrency=16)
    one = serve(ServeSpec(LLAMA, Workload(num_requests=16, **w), tier="closed-form")).results["closed form"]
    many = serve(ServeSpec(LLAMA, Workload(num_requests=1600, **w), tier="closed-form")).results["closed form"]
    wave = serve(ServeSpec(LLAMA, Workload(num_requests=1600, warmup=0, **w), tier="closed-form")).results["closed form"]
    assert one.ttft_s == many.ttft_s and wave.ttft_s.mean > many.ttft_s.mean
