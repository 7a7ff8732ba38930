import json

import pytest


def test_kernel_default_run_prints_formulas_numbers_and_bound(cli):
    out = cli("kernel", "flash-attention", check=True).stdout
    assert "2*B*H*T_kv*T_q*hd_qk + 2*B*H*T_kv*T_q*hd_v" in out
    assert "274,877,906,944" in out and "2,248,146,944" in out
    assert "bound: memory" in out and "provenance: analytic 100.0%" in out


def test_kernel_json(cli):
    doc = json.loads(cli("kernel", "flash-attention", "--json", check=True).stdout)
    assert doc["totals"]["flops.matrix"] == 274_877_906_944
    assert doc["totals"]["bytes.hbm"] == 2_248_146_944
    assert doc["totals"]["time_s"] > 0
    assert doc["leaves"]["scores"]["flops.matrix"] == 137_438_953_472
    assert doc["leaves"]["k_t"]["bytes.hbm"] == 1_073_741_824
    assert doc["symbolic"]["flops.matrix"] == "2*B*H*T_kv*T_q*hd_qk + 2*B*H*T_kv*T_q*hd_v"
    assert "time_s" in doc["symbolic"]
    assert doc["provenance_shares"] == {"analytic": 1.0}


def test_decode_point_and_sweep(cli):
    doc = json.loads(cli("kernel", "flash-attention", "--set", "T_q=1", "--set", "q_blk=1",
                         "--sweep", "B=1,2,4", "--json", check=True).stdout)
    assert doc["leaves"]["k_t"]["bytes.hbm"] == 33_554_432
    assert [p["point"]["B"] for p in doc["sweep"]] == [1, 2, 4]
    assert [p["totals"]["bytes.hbm"] for p in doc["sweep"]][1] == 2 * doc["sweep"][0]["totals"]["bytes.hbm"]
    text = cli("kernel", "flash-attention", "--sweep", "T_kv=1024,2048", "--sweep", "B=1,2").stdout
    assert "Sweep" in text


def test_symbolic_hardware_sweep(cli):
    doc = json.loads(cli("kernel", "flash-attention", "--symbolic-hw", "hbm_bandwidth_bytes_per_s",
                         "--sweep", "hbm_bandwidth_bytes_per_s=3.35e12,4.8e12", "--json", check=True).stdout)
    slow, fast = (p["totals"]["time_s"] for p in doc["sweep"])
    assert fast < slow
    assert "hbm_bandwidth_bytes_per_s" in doc["symbolic"]["time_s"]


def test_other_devices_and_device_file(cli):
    from perfcast.hardware import get_device

    doc = json.loads(cli("kernel", "flash-attention-softmax", "--device", "tpu-v5e", "--json", check=True).stdout)
    assert any("no calibration curve for tpu-v5e" in n for n in doc["notes"])
    path = str(get_device("b200-sxm").path)
    doc = json.loads(cli("kernel", "flash-attention", "--device-file", path, "--json", check=True).stdout)
    assert doc["device"] == "b200-sxm"


def test_listings(cli):
    assert "h100-sxm" in cli("devices", check=True).stdout
    names = [d["name"] for d in json.loads(cli("devices", "--json", check=True).stdout)["devices"]]
    assert "ascend-910c-die" in names
    assert "flash-attention-softmax" in cli("kernels", check=True).stdout


@pytest.mark.parametrize("args, message", [
    (["kernel", "flash-attention", "--set", "Z=3"], "unknown symbol 'Z'"),
    (["kernel", "flash-attention", "--set", "B=abc"], "'abc' is not a number"),
    (["kernel", "flash-attention", "--set", "H=nan"], "--set H=nan: 'nan' is not a finite number"),
    (["kernel", "flash-attention", "--set", "H=1e400"], "--set H=1e400: '1e400' is not a finite number"),
    (["kernel", "flash-attention", "--set", "B"], "expected SYMBOL=VALUE"),
    (["kernel", "flash-attention", "--set", "T_q=4000"], "trip count T_q/q_blk = 125/4"),
    (["kernel", "flash-attention", "--sweep", "T_kv=1000,2048"], "loop kv_tiles"),
    (["kernel", "flash-attention", "--sweep", "B="], "expected SYMBOL=v1,v2"),
    (["kernel", "flash-attention", "--set", "B=-2"], "--set B=-2: B is a size; expected a positive integer"),
    (["kernel", "flash-attn"], "unknown kernel 'flash-attn'"),
    (["kernel", "flash-attention", "--device", "h100"], "did you mean h100-sxm"),
    (["kernel", "flash-attention", "--device-file", "/nonexistent.yaml"], "cannot read"),
    (["kernel", "flash-attention", "--symbolic-hw", "warp"], "unknown hardware parameter"),
    (["kernel"], "the following arguments are required: name"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_device_file_is_one_line(cli, tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text("name: x\n")
    proc = cli("kernel", "flash-attention", "--device-file", str(p))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("perfcast kernel: error: " + str(p))


def test_padded_tiling_flag_accepts_non_dividing_sizes(cli):
    doc = json.loads(cli("kernel", "flash-attention", "--padded", "--set", "T_q=4000", "--json",
                         check=True).stdout)
    assert doc["totals"]["flops.matrix"] == 274_877_906_944  # 4000 pads to 32 tiles of 128
    assert doc["leaves"]["accumulate"]["limiter"] == "memory.onchip"
