"""``perfcast validate --serving``: the measured rows replayed by ``perfcast serve`` — the workload
each benchmark client ran, the mapping's columns, the documents' schemas."""

import json

import pytest
from jsonschema import Draft202012Validator

from perfcast.inference import silicon
from perfcast.inference.validation import ValidationRequest
from perfcast.report import validation as report
from perfcast.report.document import schema_text
from perfcast.serving.replay import ASSUMED_CLIENT, replay, workload_of
from perfcast.serving.validation import run


@pytest.fixture(scope="module")
def cases():
    frame, _ = silicon.read()
    return {c.id: c for c in silicon.map_frame(frame)}


def test_an_inferencex_row_is_replayed_with_its_clients_random_lengths(cases):
    c = next(c for c in cases.values() if c.benchmark == "inferencex" and c.predictable and c.mode == "agg")
    w, assumed = workload_of(c)
    assert (w.input_len.kind, w.input_len.a, w.input_len.b) == ("uniform", int(c.isl * 0.8), c.isl)
    assert w.num_requests == 10 * c.concurrency and w.concurrency == c.concurrency and w.warmup == 0
    assert assumed == ()


def test_a_gap_analysis_row_says_its_client_is_assumed(cases):
    c = next(c for c in cases.values() if c.benchmark == "gap-analysis" and c.predictable and c.mode == "agg")
    w, assumed = workload_of(c)
    assert w.input_len.kind == "fixed" and assumed == (ASSUMED_CLIENT,)


def test_rows_the_replay_cannot_take_say_why(cases):
    dis = next(c for c in cases.values() if c.mode == "disagg" and c.predictable and not c.decode_workers)
    assert "not stated" in replay(dis).reason
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


def test_the_documents_follow_their_schemas(doc, tmp_path):
    Draft202012Validator(json.loads(schema_text("validate"))).validate(json.loads(json.dumps(
        report.to_json(doc), default=str)) | {"schema_version": 1, "perfcast_version": "x"})
    rows = tmp_path / "rows.json"
    report.write_rows(doc, str(rows))
    body = json.loads(rows.read_text())
    Draft202012Validator(json.loads(schema_text("validate-rows"))).validate(body)
    assert any(r.get("analytic serving tpot_ms") for r in body["rows"])
