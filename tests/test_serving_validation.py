"""``perfcast validate --serving``: the measured rows replayed by ``perfcast serve`` — the workload
each benchmark client ran, the mapping's columns, the documents' schemas."""

import json

import pytest
from jsonschema import Draft202012Validator

from perfcast.inference import silicon
from perfcast.inference.validation import ValidationRequest
from perfcast.report import validation as report
from perfcast.report.document import schema_text
from perfcast.serving.replay import ASSUMED_CLIENT, INFERENCEX_CLIENT, client_of, replay, workload_of
from perfcast.serving.validation import run


@pytest.fixture(scope="module")
def cases():
    frame, _ = silicon.read()
    return {c.id: c for c in silicon.map_frame(frame)}


def test_an_inferencex_row_is_replayed_with_its_clients_random_lengths(cases):
    c = next(c for c in cases.values() if c.benchmark == "inferencex" and c.predictable and c.mode == "agg")
    w = workload_of(c)
    assert (w.input_len.kind, w.input_len.a, w.input_len.b) == ("uniform", int(c.isl * 0.8), c.isl)
    assert w.num_requests == 10 * c.concurrency and w.concurrency == c.concurrency and w.warmup == 0
    assert client_of(c) == INFERENCEX_CLIENT


def test_a_gap_analysis_row_says_its_client_is_assumed(cases):
    c = next(c for c in cases.values() if c.benchmark == "gap-analysis" and c.predictable and c.mode == "agg")
    w = workload_of(c)
    assert w.input_len.kind == "fixed" and client_of(c) == ASSUMED_CLIENT


def test_a_row_the_replay_refuses_says_why_in_the_rows_and_the_report(cases, tmp_path):
    """A mapped aggregated row perfcast serve refuses (a 15,000-token prompt under TensorRT-LLM's
    default 8,192-token budget, chunked prefill off) gets no serving figure, and its rows-file
    record and the printed report say why."""
    from rich.console import Console

    req = ValidationRequest(systems=("b200_sxm",), models=("qwen3-32b",), modes=("agg",), backends=("trtllm",))
    doc = run(req)
    refused = [p for p in doc["predictions"]["analytic"] if p.serving_reason]
    assert refused and all(p.ttft_serving_ms is None and "serving" not in p.tpot_ms for p in refused)
    assert any("is less than request 0's input_length 15000" in p.serving_reason for p in refused)
    rows = {r["id"]: r for r in report.row_records(doc)}
    assert all(rows[p.case.id]["analytic serving not priced"] == p.serving_reason for p in refused)
    console = Console(record=True, width=300)
    report.render(console, doc)
    assert "analytic: no serving figure" in console.export_text()


def test_rows_the_replay_cannot_take_say_why(cases):
    dis = next(c for c in cases.values() if c.mode == "disagg" and c.predictable and not c.decode_workers)
    assert "not stated" in replay(dis).reason
    # a load too large to simulate within validate (8,192 clients × 8,192 tokens) is refused, not run
    from perfcast.serving.replay import REPLAY_TOKEN_BUDGET

    big = next(c for c in cases.values() if c.mode == "disagg" and c.predictable and c.decode_workers
               and c.prefill_workers and c.concurrency and 10 * c.concurrency * c.osl > REPLAY_TOKEN_BUDGET)
    r, w = replay(big), workload_of(big)
    assert r.tpot_ms is None and r.closed_form_tpot_ms is None
    assert r.reason == r.closed_form_reason and r.reason.startswith(
        f"{w.num_requests:,} requests × {w.output_len.mean:,.0f} output tokens = "
        f"{w.num_requests * w.output_len.mean:,.0f} simulated tokens, over the validation replay's budget of "
        f"50,000,000 a row")
    bad = next(c for c in cases.values() if not c.predictable)
    assert replay(bad).reason == bad.reason


@pytest.fixture(scope="module")
def doc():
    return run(ValidationRequest(subset="ci", systems=("h100_sxm",), models=("llama-3.1-8b",), modes=("agg",)))


def test_every_aggregated_row_gets_a_serving_tpot_and_ttft(doc):
    for model in ("analytic", "roofline"):
        preds = [p for p in doc["predictions"][model] if p.reason is None]
        assert preds and all("serving" in p.tpot_ms and p.ttft_serving_ms > 0 for p in preds)
    pop = doc["populations"][0]["models"]["analytic"]
    assert pop["serving"]["n"] == pop["ttft-serving"]["n"] > 0


def test_every_aggregated_row_gets_the_closed_forms_figures_too(doc):
    """Beside the simulation, each aggregated row carries the closed form's mean TPOT and TTFT — the
    same figures ``perfcast serve --tier closed-form`` prints for the row's deployment and load."""
    from perfcast.serving.replay import _max_batch, deployment_of
    from perfcast.serving.serve import ServeSpec, serve

    preds = [p for p in doc["predictions"]["analytic"] if p.reason is None]
    assert preds and all("closed-form" in p.tpot_ms and p.ttft_closed_form_ms > 0 and p.closed_form_reason is None
                         for p in preds)
    pop = doc["populations"][0]["models"]["analytic"]
    assert pop["closed-form"]["n"] == pop["ttft-closed-form"]["n"] == pop["serving"]["n"]
    p = preds[0]
    c = p.case
    r = serve(ServeSpec(deployment_of(c), workload_of(c), max_batch_size=_max_batch(c), max_num_tokens=c.max_num_tokens,
                        tier="closed-form", batch_wait=c.batch_wait, memory_fraction=c.memory_fraction))
    cf = r.results["closed form"]
    assert p.tpot_ms["closed-form"] == pytest.approx(cf.tpot_s.mean * 1e3, rel=1e-12)
    assert p.ttft_closed_form_ms == pytest.approx(cf.ttft_s.mean * 1e3, rel=1e-12)
    # the two tiers are different models of the same run: here (fixed lengths, every client starting
    # together) the simulation's requests stay in step, the closed form's are spread evenly
    assert p.ttft_serving_ms != p.ttft_closed_form_ms


def test_a_disaggregated_row_gets_no_closed_form_and_says_why(cases):
    dis = next(c for c in cases.values() if c.mode == "disagg" and c.predictable and c.decode_workers
               and c.prefill_layout is not None and c.concurrency)
    r = replay(dis)
    assert r.closed_form_tpot_ms is None and "takes a request rate" in r.closed_form_reason


def test_the_documents_follow_their_schemas(doc, tmp_path):
    Draft202012Validator(json.loads(schema_text("validate"))).validate(json.loads(json.dumps(
        report.to_json(doc), default=str)) | {"schema_version": 1, "perfcast_version": "x"})
    rows = tmp_path / "rows.json"
    report.write_rows(doc, str(rows))
    body = json.loads(rows.read_text())
    Draft202012Validator(json.loads(schema_text("validate-rows"))).validate(body)
    assert any(r.get("analytic serving tpot_ms") for r in body["rows"])
    assert any(r.get("analytic closed-form tpot_ms") and r.get("analytic closed-form ttft_ms") for r in body["rows"])
    # every replayed row names the client it was replayed with (these are gap-analysis rows)
    assert {r["serving_client"] for r in body["rows"] if r["mode"] == "agg"} == {ASSUMED_CLIENT}


def test_the_decisions_of_a_group_by_hand():
    from perfcast.serving.validation import _group_stats

    # (predicted, measured tok/s/device, predicted, measured TPOT ms): the measured order is a > b > c;
    # the prediction swaps a and b. Median measured TPOT 20 ms: b (20) and c (10) meet it, a (30) not
    rows = [(90.0, 100.0, 18.0, 30.0), (95.0, 80.0, 25.0, 20.0), (10.0, 50.0, 9.0, 10.0)]
    s = _group_stats(rows)
    assert s["rho"] == pytest.approx(0.5) and not s["top1"] and s["regret"] == pytest.approx(0.2)
    # predicted to meet 20 ms: a (18) and c (9); the pick a (90) breaks the bound in the measurements
    assert (s["slo_top1"], s["slo_broken"], s["slo_regret"]) == (False, True, 1.0)
    rows[0] = (90.0, 100.0, 22.0, 30.0)   # now a is predicted to miss: the pick is c, measured best meeting is b
    s = _group_stats(rows)
    assert (s["slo_top1"], s["slo_broken"], s["slo_regret"]) == (False, False, pytest.approx(1 - 50 / 80))
    assert "slo_top1" not in _group_stats([(r[0], r[1], None, r[3]) for r in rows])   # a ranking without TPOT


def test_the_decisions_are_reported_per_named_population(doc):
    d = doc["decisions"]
    assert d["group_keys"] == ["model_path", "system", "backend", "isl", "osl"]
    assert {p["key"] for p in d["populations"]} <= {"llama-3.1-8b-h100-trtllm", "stratified"}
    for p in d["populations"]:
        assert set(p["models"]) == {"analytic", "roofline", "analytic closed form", "roofline closed form",
                                    "load only"}


def test_each_tier_ranks_the_same_rows_by_its_own_figures(cases):
    """The closed form's ranking (``<model> closed form``) takes its own TTFT and TPOT, over the
    rows both tiers replayed: a row without a closed-form figure leaves every ranking."""
    from perfcast.inference.validation import Prediction
    from perfcast.inference.validation_stats import Population
    from perfcast.serving.validation import decisions

    key = lambda c: (c.model_path, c.system, c.backend, c.isl, c.osl)  # noqa: E731
    llama = [c for c in cases.values() if c.predictable and c.mode == "agg" and c.family == "llama-3.1-8b"
             and c.backend == "trtllm" and c.system == "h100_sxm"]
    group = [c for c in llama if key(c) == key(llama[0])][:4]
    assert len(group) == 4
    fast, slow = (5.0, 50.0), (50.0, 500.0)   # (TPOT, TTFT) ms
    preds = []
    for i, c in enumerate(group):   # the simulation ranks row 0 best, the closed form row 1
        sim, cf = (fast if i == 0 else slow), (fast if i == 1 else slow)
        preds.append(Prediction(c, "analytic", {"serving": sim[0], **({"closed-form": cf[0]} if i < 3 else {})},
                                ttft_serving_ms=sim[1], ttft_closed_form_ms=cf[1] if i < 3 else None))
    pop = Population("p", frozenset(c.id for c in group), key="llama-3.1-8b-h100-trtllm")
    models = decisions({"named": [pop], "predictions": {"analytic": preds}})["populations"][0]["models"]
    assert models["analytic"]["rows"] == models["analytic closed form"]["rows"] == models["load only"]["rows"] == 3
    measured = [c.concurrency * c.osl / (c.ttft_ms + (c.osl - 1) * c.tpot_ms) / c.layout.num_devices
                for c in group[:3]]
    best = max(range(3), key=measured.__getitem__)
    assert models["analytic"]["top1_share"] == float(best == 0)
    assert models["analytic closed form"]["top1_share"] == float(best == 1)


def test_the_replays_of_one_model_and_device_run_in_one_process_in_file_order(cases, monkeypatch):
    """A compiled step model's lazily evaluated rows make a replay depend on the rows replayed
    before it on the same step model; the parallel replay must therefore keep every row of a
    model and device in one process, in file order. A stand-in replay numbers its calls per
    (step model, model, device) in its process: one process and two give the same numbers only
    if that holds."""
    from perfcast.inference.validation import Prediction
    from perfcast.serving import validation
    from perfcast.serving.replay import Replay

    seen: dict[tuple, int] = {}

    def numbered(case, step_model, seed):
        key = (step_model, case.model, case.device)
        seen[key] = seen.get(key, 0) + 1
        return Replay(ttft_ms=float(seen[key]), tpot_ms=float(len(seen)))

    monkeypatch.setattr(validation, "replay", numbered)
    rows = [c for c in cases.values() if c.predictable and c.mode == "agg"][::25][:80]
    assert len({(c.model, c.device) for c in rows}) >= 3
    preds = {m: [Prediction(c, m) for c in rows] for m in ("analytic", "roofline", "profiling")}
    outs = []
    for jobs in (1, 2):
        seen.clear()
        outs.append(validation.augment(preds, jobs=jobs))
    ttft = [[p.ttft_serving_ms for p in out[m]] for out in outs for m in ("analytic", "roofline")]
    assert ttft[:2] == ttft[2:] and max(ttft[0]) > 1
    assert all(p.ttft_serving_ms is None for out in outs for p in out["profiling"])  # no closed form: no replay


def test_a_killed_replay_process_is_one_line_naming_what_did_not_finish(cases, monkeypatch):
    """A group's process killed by the system (out of memory) is a UserError — one line naming
    --jobs and the groups left — not BrokenProcessPool's traceback."""
    from concurrent.futures.process import BrokenProcessPool

    from perfcast.inference.validation import Prediction
    from perfcast.ir import UserError
    from perfcast.serving import validation

    def killed(fn, tasks, jobs=None, size=None, fresh=False):
        yield 0, fn(tasks[0])
        raise BrokenProcessPool("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(validation, "forked_map", killed)
    monkeypatch.setattr(validation, "replay", lambda case, step_model, seed: validation.Replay(1.0, 1.0))
    rows = [c for c in cases.values() if c.predictable and c.mode == "agg"][::25][:80]
    first = next(iter(dict.fromkeys((c.model, c.device) for c in rows)))
    with pytest.raises(UserError, match=r"^--jobs 2: a replay process was killed before it finished \(most likely "
                                        r"out of memory.*not finished: .* on .*\); rerun with --jobs 1") as e:
        validation.augment({"analytic": [Prediction(c, "analytic") for c in rows]}, jobs=2)
    assert f"{first[0]} on {first[1]}" not in str(e.value).split("not finished: ")[1]
