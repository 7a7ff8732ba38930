"""Fuzzing the command line: random argv lists for the commands that answer in well under a
second — numbers of every kind where a number goes (nan, inf, 1e400, -1, 0, 2**63, floats for
integers), junk strings, repeated flags and flags of other commands — each answered as promised
(:func:`fuzzing.check_answered`: one error line and exit 2, or exit 0 with finite, non-negative
figures). ``text-generate`` and ``explain`` with a bad flag must refuse it before any capture.

Ten fuzz tests, 455 generated cases (the ``max_examples`` below); about 45 s of CPU."""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, given, settings

from fuzzing import check_answered, run_cli
from perfcast.cli.main import build_parser

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: what goes where a number goes: the values that broke perfcast before, and plain ones
NUMBER_TEXTS = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "-1", "0", "-0", "1.5", "0.5", "1e-320", str(2**63),
                str(-2**63), str(2**64), "1e30", "0x10", "1_000", "", " ", "abc", "٣", "1e", "True",
                "1", "2", "4", "8", "16", "64", "128", "1024", "4096", "1e6", "64e6", "1e11"]
junk = st.text(max_size=12)
numbers = st.one_of(st.sampled_from(NUMBER_TEXTS), st.integers(-2**70, 2**70).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr))


def mostly(*valid: str, bad=numbers):
    """A value that is one of ``valid`` two times in three, else ``bad``."""
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), bad)


DEVICES = ["h100-sxm", "h200-sxm", "b200-sxm", "mi300x", "tpu-v5p", "gb200", "h100", "/nonexistent.yaml"]
devices = st.sampled_from(DEVICES) | junk


def _flags_of(*command: str) -> set[str]:
    parser = build_parser()
    for name in command:
        parser = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)) \
            .choices[name]
    return {o for a in parser._actions for o in a.option_strings}


#: flags of some command (with a value where they take one), for the commands that do not take them
FOREIGN = [["--set", "B=1"], ["--sweep", "B=1,2"], ["--bytes", "1"], ["--tree"], ["--link-bandwidth", "1e9"],
           ["--symbolic-hw", "hbm_bandwidth_bytes_per_s"], ["--group-size", "2"], ["--stride", "2"],
           ["--num-queries", "2"], ["--tp-size", "2"], ["--top", "3"], ["--topology", "hgx-h200"],
           ["--topology-file", "t.yaml"], ["--seed", "1"], ["--device-name", "x"], ["--shape", "4x4"],
           ["--engine-file", "e.yaml"], ["--dir", "/nonexistent"], ["--repeats", "2"]]


@st.composite
def argv_of(draw, command: tuple[str, ...], positional=(), flags: dict | None = None, switches=()):
    """``perfcast COMMAND`` with some of its flags (each a value strategy), sometimes one given
    twice, sometimes a flag of another command, in any order."""
    flags = flags or {}
    chosen = draw(st.lists(st.sampled_from(sorted(flags) + list(switches)), unique=True, max_size=6)) \
        if flags or switches else []
    items = [[f] if f in switches else [f, draw(flags[f])] for f in chosen]
    if items and draw(st.integers(0, 5)) == 0:  # a flag given twice
        items.append(list(draw(st.sampled_from(items))))
    if draw(st.integers(0, 5)) == 0:
        items.append(draw(st.sampled_from(FOREIGN)))
    items = draw(st.permutations(items))
    return [*command, *(draw(p) for p in positional), *(x for item in items for x in item)]


def _answered(argv) -> None:
    rc, out, err = run_cli(*argv)
    event(f"exit {rc}")  # --hypothesis-show-statistics: how many cases priced, how many were refused
    check_answered(rc, out, err, argv)


# -- collective --------------------------------------------------------------------------------

OPS = ["all_gather", "all-gather", "reduce_scatter", "reduce-scatter", "all_reduce", "all-reduce", "all_to_all",
       "broadcast", "send_recv", "send-recv", "gossip", "ALL_GATHER"]
TOPOLOGIES = ["hgx-h200", "hgx-h100", "tpu-v5p-4x4x4", "gb200-nvl72", "ring:8", "torus:2x2x2", "mesh:4x4", "switch:8",
              "full_mesh:4", "ring:0", "torus:0x2", "switch:x", "nosuch", "ring:99999999999999"]


@settings(max_examples=80, **SETTINGS)
@given(argv_of(("collective",), positional=[mostly(*OPS, bad=junk)],
               flags={"--topology": mostly(*TOPOLOGIES, bad=junk), "--bytes": mostly("1", "1024", "64e6", "1e12"),
                      "--link-bandwidth": mostly("1e9", "50e9", "4.5e11"), "--link-latency": mostly("0", "1e-6"),
                      "--group-size": mostly("1", "2", "4", "8", "16"), "--stride": mostly("1", "2", "8"),
                      "--algorithm": st.sampled_from(["ring", "multiport", "tree", "direct", "hierarchical",
                                                      "ring/ll", "Ring"]) | junk},
               switches=["--json"]),
       st.sampled_from(TOPOLOGIES[:8]), mostly("1", "1024", "64e6", "1e12"))
def test_collective(argv, topology, nbytes):
    for flag, value in (("--topology", topology), ("--bytes", nbytes)):  # required, unless the case gives them
        if flag not in argv:
            argv = argv + [flag, value]
    _answered(argv)


@settings(max_examples=30, **SETTINGS)
@given(st.sampled_from(OPS[:10]), st.sampled_from(["hgx-h200", "tpu-v5p-4x4x4", "gb200-nvl72", "ring:8", "torus:4x4",
                                                  "switch:16", "full_mesh:8"]),
       st.floats(1, 1e13).map(repr), st.sampled_from([None, "1", "2", "4", "8", "16", "64"]),
       st.sampled_from(["1", "2", "4"]), st.floats(1e6, 1e13).map(repr), st.floats(0, 1e-4).map(repr))
def test_collective_prices_plausibly(op, topology, nbytes, group, stride, bandwidth, latency):
    """Valid values only: a price (finite, non-negative), or a line saying the group does not fit."""
    links = ["--link-bandwidth", bandwidth, "--link-latency", latency] if ":" in topology else []
    _answered(["collective", op, "--topology", topology, "--bytes", nbytes, "--stride", stride, *links,
               *(["--group-size", group] if group else []), "--json"])


# -- kernel ------------------------------------------------------------------------------------

SYMBOLS = ["B", "H", "T_q", "T_kv", "hd_qk", "hd_v", "q_blk", "kv_blk", "T", "D", "I_moe", "E", "top_k", "n_shared",
           "EP", "TP", "n", "acc_latency", "m", "k", "hbm_bandwidth_bytes_per_s", "matrix_flops_per_s", "Z"]
sizes = st.one_of(st.integers(1, 4096).map(str), st.sampled_from(["64", "128", "256", "4096"]), numbers)
assignments = st.builds(lambda s, v: f"{s}={v}", st.sampled_from(SYMBOLS), sizes) | junk
sweeps = st.builds(lambda s, vs: f"{s}={','.join(vs)}", st.sampled_from(SYMBOLS),
                   st.lists(sizes, min_size=1, max_size=3))
KERNEL_FLAGS = {"--device": devices, "--device-file": st.sampled_from(["/nonexistent.yaml", "."]) | junk,
                "--set": assignments, "--sweep": sweeps,
                "--symbolic-hw": st.sampled_from(["hbm_bandwidth_bytes_per_s", "matrix_flops_per_s", "warp"]) | junk,
                "--topology": st.sampled_from(TOPOLOGIES) | junk, "--link-bandwidth": numbers,
                "--overlap": st.sampled_from(["double-buffer", "double_buffer", "a2a-experts", "comm_overlap",
                                              "weight-prefetch", "all", "none"]) | junk,
                "--rollup": st.sampled_from(["fast", "slow", "both", "medium"])}


@settings(max_examples=100, **SETTINGS)
@given(argv_of(("kernel",), positional=[st.sampled_from(["flash-attention", "flash-attention-softmax",
                                                         "deepseek-moe", "modulo-reference", "flash-attn"])],
               flags=KERNEL_FLAGS, switches=["--json", "--tree", "--padded"]))
def test_kernel(argv):
    _answered(argv)


@settings(max_examples=12, **SETTINGS)
@given(argv_of(("kernel",), positional=[st.sampled_from(["pi0", "pi05"])],
               flags={"--set": st.builds(lambda s, v: f"{s}={v}", st.sampled_from(["B", "images", "L", "k", "H"]),
                                         numbers),
                      "--device": devices, "--rollup": st.sampled_from(["fast", "medium"])},
               switches=["--json", "--padded"]))
def test_kernel_pi0(argv):
    _answered(argv)


# -- op, and the commands that list ------------------------------------------------------------

square = st.sampled_from(["1", "64", "4096", str(2**31 - 1)]).map(lambda n: f"{n}x{n}")
dims = square | st.lists(st.one_of(st.integers(-2, 8192).map(str), st.sampled_from(["0", str(2**40), "nan", "1.5"])),
                min_size=1, max_size=3).map("x".join)


@settings(max_examples=40, **SETTINGS)
@given(argv_of(("op",), positional=[st.sampled_from(["mm", "aten.mm.default", "aten.mul.Tensor", "nosuch"])],
               flags={"--shape": dims | junk, "--arg": mostly("1", "-1", "0.5", "true"),
                      "--dtype": mostly("bf16", "fp32", bad=junk),
                      "--device": devices, "--performance-model": mostly("analytic", bad=st.just("magic")),
                      "--profiling-database": st.just("/nonexistent"), "--engine": mostly("vllm", "xla", bad=junk)},
               switches=["--json"]), dims)
def test_op(argv, shape):
    if "--shape" not in argv:  # a square matrix multiplies itself; mul takes one tensor and --arg
        argv = argv + ["--shape", shape] * (1 if argv[1] == "aten.mul.Tensor" else 2)
    _answered(argv)


LISTINGS = {
    ("devices",): {"--device-file": st.sampled_from(["/nonexistent.yaml", "."]) | junk},
    ("topologies",): {"--topology-file": st.sampled_from(["/nonexistent.yaml", "."]) | junk},
    ("engines",): {"--engine-file": st.sampled_from(["/nonexistent.yaml", "."]) | junk},
    ("models",): {}, ("kernels",): {},
}


@settings(max_examples=50, **SETTINGS)
@given(st.sampled_from(sorted(LISTINGS)).flatmap(
    lambda c: argv_of(c, positional=[st.sampled_from(["", "vllm", "trtllm", "nope"])] if c == ("engines",) else (),
                      flags=LISTINGS[c], switches=["--json"])))
def test_listings(argv):
    if argv[:2] == ["engines", ""]:
        argv = ["engines", *argv[2:]]
    _answered(argv)


@settings(max_examples=15, **SETTINGS)
@given(argv_of(("db", "list"), flags={"--dir": st.sampled_from(["/nonexistent", "/dev/null"]) | junk},
               switches=["--json"]), devices)
def test_db_list(argv, device):
    _answered(argv + ["--device", device])  # one device's databases: listing all of them takes seconds


# -- text-generate and explain: a bad flag is refused before any capture ------------------------

INVALID = st.one_of(st.sampled_from(["nan", "inf", "-inf", "1e400", "-1", "-5", "1.5", "abc", "", str(2**63), "1e30"]),
                    st.integers(2**63, 2**80).map(str), st.integers(-2**70, -1).map(str))
TG_NUMBERS = ["--num-queries", "--query-length", "--context-length", "--memory-utilization", "--num-devices",
              "--tp-size", "--ep-size", "--dp-size", "--pp-size", "--micro-batches", "--image-batch-size",
              "--image-height", "--image-width", "--top"]
TG_ONLY = [["--num-queries", "2"], ["--tp-size", "2"], ["--topology", "hgx-h200"], ["--top", "3"],
           ["--performance-model", "analytic"], ["--rollup", "fast"]]
REPEATED = [["--device", "h100-sxm"], ["--dtype", "bf16"], ["--json"], ["--decode"], ["--engine", "vllm"],
            ["--quantize", "fp8"], ["--no-cache"]]
TG_INAPPLICABLE = [["--attention-dp"], ["--micro-batches", "2"],
                   ["--decode", "--context-length", "8", "--query-length", "16"],
                   ["--top", "5", "--json"], ["--profiling-database", "db"], ["--export-empirical-metrics", "m.json"],
                   ["--encoder-tp-mode", "data"], ["--device", "h100-sxm", "--device-file", "d.yaml"],
                   ["--topology", "hgx-h200"], ["--topology", "switch:8", "--tp-size", "2"],
                   ["--device", "b200-sxm", "--topology", "hgx-h100", "--tp-size", "2"],
                   ["--num-queries", "1048576", "--query-length", "4096"], ["--context-length", "2147483647"],
                   ["--device", "nosuch"], ["--dtype", "fp8"], ["--no-fusion"]]


def _foreign(command: str):
    own = _flags_of(command)
    return [f for f in FOREIGN + TG_ONLY if not any(o.startswith(f[0]) for o in own)]


@st.composite
def refused_argv(draw, command: str):
    """``perfcast COMMAND MODEL`` with harmless flags and one that must be refused."""
    kinds = [st.builds(lambda f, v: [f, v], st.sampled_from(TG_NUMBERS if command == "text-generate"
                                                            else ["--context-length"]), INVALID),
             st.sampled_from(REPEATED).map(lambda f: f + f),
             st.sampled_from(_foreign(command))]
    kinds.append(st.sampled_from(TG_INAPPLICABLE) if command == "text-generate" else
                 st.sampled_from([["--decode", "--context-length", "5"], ["--device", "a", "--device-file", "b"],
                                  ["--context-length", "-1"], ["--no-fusion"]]))
    bad = draw(st.one_of(*kinds))
    harmless = draw(st.lists(st.sampled_from([["--dtype", "fp16"], ["--kv-cache-dtype", "fp8"], ["--no-cache"],
                                              ["--engine", "trtllm"]]), unique_by=lambda f: f[0], max_size=2))
    items = draw(st.permutations([bad, *(h for h in harmless if h[0] not in bad)]))
    model = draw(st.sampled_from(["qwen3-8b", "llama-3.1-8b", "qwen3-30b-a3b", "qwen2.5-vl-7b-instruct"]))
    return [command, model, *(x for item in items for x in item)]


def _refused_before_capture(argv) -> None:
    captured = AssertionError(f"captured before refusing {argv!r}")
    with mock.patch("perfcast.capture.cache.symbolic_capture", side_effect=captured), \
            mock.patch("perfcast.capture.capture", side_effect=captured):
        rc, out, err = run_cli(*argv)
    assert rc == 2, (argv, err)
    check_answered(rc, out, err, argv)


@settings(max_examples=90, **SETTINGS)
@given(refused_argv("text-generate"))
def test_text_generate_refuses_a_bad_flag_before_capture(argv):
    _refused_before_capture(argv)


@settings(max_examples=30, **SETTINGS)
@given(refused_argv("explain"))
def test_explain_refuses_a_bad_flag_before_capture(argv):
    _refused_before_capture(argv)


@settings(max_examples=8, **SETTINGS)
@given(st.integers(1, 64), st.one_of(st.builds(lambda n: ["--query-length", str(n)], st.integers(1, 4096)),
                                     st.builds(lambda n: ["--decode", "--context-length", str(n)],
                                               st.integers(1, 32768))),
       st.sampled_from([[], ["--dtype", "fp16"], ["--kv-cache-dtype", "fp8"]]))
def test_text_generate_answers_plausibly(batch, phase, extra):
    _answered(["text-generate", "qwen3-8b", "--num-queries", str(batch), *phase, *extra, "--json"])


def test_the_foreign_flags_drawn_are_not_the_commands_own():
    assert ["--num-queries", "2"] in _foreign("explain") and ["--num-queries", "2"] not in _foreign("text-generate")
    assert ["--topology", "hgx-h200"] in _foreign("explain") and ["--set", "B=1"] in _foreign("text-generate")
