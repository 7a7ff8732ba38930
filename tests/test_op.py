"""perfcast op: single ops through the text-generate path."""

import json

import pytest

from perfcast.hardware import get_device
from perfcast.inference.single_op import OpRequest, price


def test_single_op_json(cli):
    doc = json.loads(cli("op", "mm", "--shape", "4096x4096", "--shape", "4096x14336", "--device",
                         "h200-sxm", "--json", check=True).stdout)
    m = doc["performance_models"]["analytic"]
    assert m["time_s"] > 2 * 4096 * 4096 * 14336 / 989.4e12 and m["source"] == "analytic"
    assert m["bound"] == "compute"


def test_same_price_as_inside_a_captured_model(tmp_path):
    from perfcast.inference.textgen import Request, simulate
    from perfcast.models import load_model_config

    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
                               "head_dim": 32, "vocab_size": 1000, "max_position_embeddings": 4096}))
    dev = get_device("h100-sxm")
    # eager: the captured q_proj is a kernel of its own, as the op alone is
    r = simulate(Request(load_model_config(str(cfg)), dev, num_queries=2, context_length=8, decode=True,
                         engine="eager"))
    ev = r.evaluations["analytic"]
    q_proj = [row for name, row in ev.leaves.items() if "q_proj" in name][0]
    alone = price(OpRequest("mm", ((2, 256), (256, 256))), dev, ("analytic",), engine="eager")
    # the op alone is the same kernel under the same engine: the same time, its fixed launch
    # cost inside (a calibrated kernel's fit holds it), the host's launch interval not
    assert alone["performance_models"]["analytic"]["time_s"] == pytest.approx(q_proj["time_s"], rel=1e-12)
    # inside the eager step the host's launches are the step's, charged apart from every kernel
    assert q_proj["launch_s"] == 0 and ev.host_launch_s > 0


def test_batch_in_row_order(cli, tmp_path):
    f = tmp_path / "ops.csv"
    f.write_text("op,shapes,dtype,args\nmm,1024x4096;4096x4096,bf16,\naten._softmax,8x4096,fp16,-1;false\n"
                 "aten.mul.Tensor,4x4;4x4,fp32,\n")
    lines = cli("op", "--batch", str(f), "--json", check=True).stdout.splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["op"] for r in rows] == ["mm", "aten._softmax", "aten.mul.Tensor"]
    assert all(r["performance_models"]["analytic"]["time_s"] > 0 for r in rows)


@pytest.mark.parametrize("args, message", [
    (["op", "frob", "--shape", "2x2"], "unknown op 'frob'"),
    (["op", "mm", "--shape", "4x4", "--shape", "5x4"], "must have same reduction dim"),
    (["op", "mm", "--shape", "4xq"], "expected dims like"),
    (["op", "mm"], "give an op and its --shape"),
    (["op", "--batch", "/nonexistent.csv"], "cannot read"),
])
def test_errors(cli, args, message):
    proc = cli(*args)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
