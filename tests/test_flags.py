"""Flags: a single-valued flag given twice, a flag that does not apply to the command or the
combination given, a device that is not its topology's, and a number out of its range are each
one line on stderr and exit 2 — before any capture (docs/design/cli.md)."""

from __future__ import annotations

import argparse
import json

import pytest

from fuzzing import run_cli
from perfcast.cli.args import MAX_TOKENS, Number
from perfcast.cli.main import build_parser


def refused(*argv: str) -> str:
    """The one error line of ``perfcast ARGV`` (asserting exit 2, nothing on stdout)."""
    rc, out, err = run_cli(*argv)
    assert rc == 2 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


# -- a single-valued flag given twice ------------------------------------------------------------

def _commands(parser=None, prefix=()):
    """(argv prefix, parser) of every (sub)command."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
            return
    yield prefix, parser


def _repeatable(action) -> bool:
    return isinstance(action, (argparse._AppendAction, argparse._HelpAction))


def _value(action) -> list[str]:
    if action.nargs == 0:
        return []
    if action.choices:
        return [str(next(iter(action.choices)))]
    return ["1" if isinstance(action.type, Number) else "x"]


SINGLE = [(prefix, a.option_strings[-1], _value(a)) for prefix, p in _commands() for a in p._actions
          if a.option_strings and not _repeatable(a)]


def test_every_single_valued_flag_of_every_command_is_covered():
    # 21 commands (db's three: list, import aiconfigurator, check); all but db check and schema take flags
    assert len(list(_commands())) == 21 and len({p for p, _, _ in SINGLE}) == 19 and len(SINGLE) >= 100
    assert (("text-generate",), "--device", ["x"]) in SINGLE and (("db", "check"), "--device", ["x"]) not in SINGLE
    # the run's figures and its page, on the same five commands
    plots = {p for p, f, _ in SINGLE if f == "--plot"}
    assert plots == {p for p, f, _ in SINGLE if f == "--html"} == \
        {("text-generate",), ("serve",), ("optimize",), ("validate",), ("kernel",)}


@pytest.mark.parametrize("prefix, flag, value", SINGLE, ids=[f"{' '.join(p)} {f}" for p, f, _ in SINGLE])
def test_a_single_valued_flag_given_twice_is_an_error_naming_it(prefix, flag, value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*prefix, flag, *value, flag, *value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(f"perfcast {' '.join(prefix)}: error: {flag} given twice")
    assert err.endswith("; give it once\n") and err.count("\n") == 1


def test_the_repeated_values_are_named():
    assert refused("kernel", "flash-attention", "--device", "h100-sxm", "--device", "b200-sxm") == \
        "perfcast kernel: error: --device given twice ('h100-sxm', then 'b200-sxm'); give it once"
    assert refused("text-generate", "qwen3-8b", "--tp-size", "2", "--tp-size", "4") == \
        "perfcast text-generate: error: --tp-size given twice (2, then 4); give it once"
    # an abbreviation is the same flag
    assert refused("collective", "all_reduce", "--topology", "hgx-h200", "--top", "hgx-h100", "--bytes", "1") == \
        "perfcast collective: error: --topology given twice ('hgx-h200', then 'hgx-h100'); give it once"
    assert refused("models", "--json", "--json") == "perfcast models: error: --json given twice; give it once"


def test_repeatable_flags_stay_repeatable():
    rc, out, err = run_cli("kernel", "flash-attention", "--set", "B=2", "--set", "H=8", "--overlap", "double-buffer",
                           "--overlap", "comm-overlap", "--json")
    assert rc == 0, err
    assert json.loads(out)["point"] == {"B": 2, "H": 8, "T_q": 4096, "T_kv": 4096, "hd_qk": 128, "hd_v": 128,
                                        "q_blk": 128, "kv_blk": 128}


@pytest.mark.parametrize("argv, message", [
    (["--set", "H=2", "--set", "H=4"], "--set H: H is given by --set already; give it once"),
    (["--set", "H=2", "--sweep", "H=4,8"], "--sweep H: H is given by --set already; give it once"),
    (["--sweep", "H=2,4", "--sweep", "H=8"], "--sweep H: H is given by --sweep already; give it once"),
])
def test_a_design_symbol_given_twice_is_an_error(argv, message):
    assert refused("kernel", "flash-attention", *argv) == f"perfcast kernel: error: {message}"


# -- flags that do not apply -------------------------------------------------------------------

TG = ("text-generate", "qwen3-8b")


@pytest.mark.parametrize("argv, message", [
    ([*TG, "--attention-dp"], "--attention-dp: needs --dp-size > 1 (the data-parallel ranks that pool their "
                              "tokens in the MoE layers)"),
    ([*TG, "--micro-batches", "2"], "--micro-batches: pipeline micro-batches need --pp-size > 1"),
    ([*TG, "--decode", "--context-length", "8", "--query-length", "16"],
     "--query-length: a decode step prices one new token per sequence; --context-length sets the tokens already "
     "cached"),
    ([*TG, "--top", "5", "--json"], "--top: sets the rows of the tables; --json lists every op"),
    ([*TG, "--profiling-database", "db"], "--profiling-database: is read by --performance-model profiling only"),
    ([*TG, "--export-empirical-metrics", "m.json"],
     "--export-empirical-metrics: writes the profiling model's hits and misses: add --performance-model profiling"),
    (["text-generate", "qwen2.5-vl-7b-instruct", "--encoder-tp-mode", "data"],
     "--encoder-tp-mode: how the vision encoder runs over --tp-size ranks; with --tp-size 1 every mode is the same"),
    ([*TG, "--device", "h100-sxm", "--device-file", "my.yaml"], "--device: give a device name or --device-file, "
                                                                "not both"),
    ([*TG, "--topology", "hgx-h200"], "--topology hgx-h200: a step on one device uses no links; give --tp-size, "
                                      "--dp-size or --pp-size (or --device alone for one device)"),
    ([*TG, "--tp-size", "2", "--topology", "switch:8"],
     "--topology switch:8: text-generate takes a shipped topology (see `perfcast topologies`) or a topology YAML "
     "file, which gives the links' bandwidth"),
    (["explain", "qwen3-8b", "--decode", "--context-length", "5"],
     "--context-length: a decode step's context C is always symbolic; --context-length makes it symbolic in a "
     "prefill"),
    (["kernel", "flash-attention", "--tree", "--json"], "--tree: prints the op tree as text; --json has no tree"),
    (["kernel", "flash-attention", "--link-bandwidth", "1e11"],
     "--link-bandwidth: sets the links of an ad-hoc --topology KIND:SHAPE; no --topology given"),
    (["kernel", "deepseek-moe", "--topology", "hgx-h200", "--link-bandwidth", "1e11"],
     "--link-bandwidth: applies to ad-hoc KIND:SHAPE topologies; hgx-h200 gives its own"),
    (["kernel", "pi0", "--padded"], "--padded: kernel pi0 is traced with padded tiling already"),
    (["kernel", "flash-attention", "--rollup", "slow", "--overlap", "all"],
     "--overlap: rewrites the fast roll-up's sum, which --rollup slow does not show; use --rollup both"),
    (["kernel", "flash-attention", "--rollup", "slow", "--sweep", "B=1,2"],
     "--sweep: the slow roll-up schedules the design point only; use --rollup both to see the sweep beside it"),
    (["collective", "all_reduce", "--topology", "hgx-h200", "--bytes", "1e6", "--link-latency", "1e-6"],
     "--link-latency: applies to ad-hoc KIND:SHAPE topologies; hgx-h200 gives its own"),
    (["op", "--batch", "ops.csv", "--shape", "4x4"], "--shape: the --batch CSV gives each op's; give one or the other"),
    (["op", "mm", "--batch", "ops.csv"], "op 'mm': the --batch CSV names the ops; give one or the other"),
    (["op", "mm", "--shape", "4x4", "--shape", "4x4", "--profiling-database", "db"],
     "--profiling-database: is read by --performance-model profiling only"),
    (["engines", "vllm", "--engine-file", "my.yaml"],
     "--engine-file: give a profile file or a shipped engine's name ('vllm'), not both"),
    (["validate", "--population", "published", "--seed", "1"],
     "--seed: draws the stratified sample; --population published is not drawn"),
    (["validate", "--subset", "ci", "--jobs", "2"], "--jobs: sets the processes of the serving replay; add --serving"),
])
def test_a_flag_that_does_not_apply_is_refused(argv, message):
    assert refused(*argv) == f"perfcast {argv[0]}: error: {message}"


def test_db_list_takes_a_device_name_not_a_pattern():
    assert refused("db", "list", "--device", "*") == \
        "perfcast db: error: --device '*': expected a device name (lower-case letters, digits, '.' and '-')"


def test_db_check_of_a_missing_directory_errs_on_stderr():
    assert refused("db", "check", "/nonexistent/db") == \
        "perfcast db: error: /nonexistent/db: not a directory (expected a profiling database, or a tree of them)"


# -- the device of a topology ------------------------------------------------------------------

def test_a_topology_without_a_device_prices_on_the_topologys_device():
    rc, out, err = run_cli("kernel", "deepseek-moe", "--topology", "hgx-h200", "--json")
    assert rc == 0, err
    assert json.loads(out)["device"] == "h200-sxm"
    from perfcast.cli.devices import resolve_device
    from perfcast.hardware.topology import get_topology

    args = build_parser().parse_args(["text-generate", "qwen3-8b", "--tp-size", "2", "--topology", "hgx-b200"])
    assert resolve_device(args, get_topology("hgx-b200")).name == "b200-sxm"
    args = build_parser().parse_args(["text-generate", "qwen3-8b"])
    assert resolve_device(args).name == "h100-sxm"


@pytest.mark.parametrize("argv, message", [
    (["kernel", "deepseek-moe", "--topology", "hgx-h200", "--device", "h100-sxm"],
     "--device: h100-sxm is not the device of topology hgx-h200 (h200-sxm); drop --device to price on h200-sxm, "
     "or pass --topology hgx-h100"),
    (["text-generate", "qwen3-8b", "--device", "b200-sxm", "--topology", "hgx-h100", "--tp-size", "2"],
     "--device: b200-sxm is not the device of topology hgx-h100 (h100-sxm); drop --device to price on h100-sxm, "
     "or pass --topology hgx-b200"),
    (["text-generate", "qwen3-8b", "--device", "mi300x", "--topology", "hgx-h100", "--tp-size", "2"],
     "--device: mi300x is not the device of topology hgx-h100 (h100-sxm); drop --device to price on h100-sxm, "
     "or pass a topology file of mi300x devices"),
])
def test_a_device_that_is_not_the_topologys_is_refused(argv, message):
    assert refused(*argv) == f"perfcast {argv[0]}: error: {message}"


def test_the_library_refuses_a_device_off_its_topology_too():
    from perfcast.capture.parallel import Layout
    from perfcast.hardware import get_device
    from perfcast.inference.textgen import Request
    from perfcast.ir import UserError
    from perfcast.models import load_model_config

    req = Request(load_model_config("qwen3-8b"), get_device("b200-sxm"), layout=Layout(tp=2), topology="hgx-h100")
    with pytest.raises(UserError, match="^--topology hgx-h100 is built from h100-sxm devices, not b200-sxm$"):
        req.mesh()


def test_a_missing_topology_suggests_only_what_text_generate_takes():
    from perfcast.inference.textgen import default_topology
    from perfcast.ir import UserError

    with pytest.raises(UserError) as info:
        default_topology("mi300x")
    assert str(info.value) == ("several devices on mi300x need a topology: pass --topology (a shipped name — see "
                               "`perfcast topologies` — or a topology YAML file)")


def test_overlap_names_take_either_spelling():
    from perfcast.rollup.overlap import parse

    assert parse(["double_buffer", "comm-overlap", "weight_prefetch"]) == \
        ("double-buffer", "comm-overlap", "weight-prefetch")
    assert refused("kernel", "flash-attention", "--overlap", "double__buffer") == \
        "perfcast kernel: error: --overlap 'double__buffer': expected one of double-buffer, a2a-experts, " \
        "comm-overlap, weight-prefetch or all"


# -- numbers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--num-queries", "0"], "--num-queries: expected at least 1, got '0'"),
    (["--num-queries", "-1"], "--num-queries: expected at least 1, got '-1'"),
    (["--num-queries", "1.5"], "--num-queries: expected an integer, got '1.5'"),
    (["--num-queries", "nan"], "--num-queries: expected a finite number, got 'nan'"),
    (["--num-queries", "two"], "--num-queries: expected an integer, got 'two'"),
    (["--num-queries", "16777217"], "--num-queries: expected at most 16,777,216 (2**24 sequences), got '16777217'"),
    (["--query-length", str(2**63)], "--query-length: expected at most 2,147,483,647 (tokens are counted in 32-bit "
                                     "integers), got '9223372036854775808'"),
    (["--context-length", str(2**63)], "--context-length: expected at most 2,147,483,647 (tokens are counted in "
                                       "32-bit integers), got '9223372036854775808'"),
    (["--context-length", "-1"], "--context-length: expected at least 0, got '-1'"),
    (["--memory-utilization", "0"], "--memory-utilization: expected a positive number, got '0'"),
    (["--memory-utilization", "1.5"], "--memory-utilization: expected at most 1 (a share), got '1.5'"),
    (["--memory-utilization", "inf"], "--memory-utilization: expected a finite number, got 'inf'"),
    (["--tp-size", "0"], "--tp-size: expected at least 1, got '0'"),
    (["--pp-size", "1e400"], "--pp-size: expected a finite number, got '1e400'"),
    (["--top", "0"], "--top: expected at least 1, got '0'"),
    (["--image-height", "70000"], "--image-height: expected at most 65,535 (the largest image side a JPEG states), "
                                  "got '70000'"),
    (["--num-queries", "1048576", "--query-length", "4096"],
     "4,294,967,296 tokens in one step (--num-queries × new tokens): more than the 2,147,483,647 attention kernels "
     "count in 32-bit integers"),
    (["--context-length", str(MAX_TOKENS)],
     "2,147,484,671 tokens in one sequence (--context-length + new tokens): more than the 2,147,483,647 attention "
     "kernels count in 32-bit integers"),
])
def test_text_generate_numbers_are_checked_where_they_enter(argv, message):
    assert refused(*TG, *argv) == f"perfcast text-generate: error: {message}"


def test_image_tokens_count_against_the_steps_tokens():
    assert refused("text-generate", "qwen2.5-vl-7b-instruct", "--device", "h200-sxm", "--query-length", str(MAX_TOKENS),
                   "--image-batch-size", "1", "--image-height", "448", "--image-width", "448") == \
        ("perfcast text-generate: error: --image-batch-size 1: 256 image tokens per sequence make more than the "
         "2,147,483,647 tokens in one step that attention kernels count in 32-bit integers")


@pytest.mark.parametrize("argv, message", [
    (["--set", "H=1e30"], "--set H=1e+30: H is a size; expected at most 2,147,483,647 (extents are indexed with "
                          "32-bit integers)"),
    (["--set", "H=1.5"], "--set H=1.5: H is a size; expected a positive integer"),
    (["--set", "H=0"], "--set H=0: H is a size; expected a positive integer"),
    (["--sweep", "T_kv=1024,1e30"], "--sweep T_kv=1e+30: T_kv is a size; expected at most 2,147,483,647 (extents "
                                    "are indexed with 32-bit integers)"),
    (["--sweep", "B=1,inf"], "--sweep B=inf: 'inf' is not a finite number"),
    (["--symbolic-hw", "hbm_bandwidth_bytes_per_s", "--set", "hbm_bandwidth_bytes_per_s=-1"],
     "--set hbm_bandwidth_bytes_per_s=-1: hbm_bandwidth_bytes_per_s is a hardware rate; expected a positive number"),
    # 1e-300 B/s priced a load at an infinite time: the bounds of a device file's figures apply
    (["--symbolic-hw", "hbm_bandwidth_bytes_per_s", "--sweep", "hbm_bandwidth_bytes_per_s=1e12,1e-300"],
     "--sweep hbm_bandwidth_bytes_per_s=1e-300: hbm_bandwidth_bytes_per_s is a hardware rate; expected a number "
     "from 1e-30 to 1e+30, as in a device file"),
])
def test_design_values_are_checked_by_their_symbols_kind(argv, message):
    assert refused("kernel", "flash-attention", *argv) == f"perfcast kernel: error: {message}"


def test_a_hardware_parameter_takes_a_positive_number_in_a_device_files_range():
    rc, out, err = run_cli("kernel", "flash-attention", "--symbolic-hw", "hbm_bandwidth_bytes_per_s",
                           "--set", "hbm_bandwidth_bytes_per_s=1.5e12", "--json")
    assert rc == 0, err
    assert json.loads(out)["point"]["hbm_bandwidth_bytes_per_s"] == 1.5e12


@pytest.mark.parametrize("argv, message", [
    (["--shape", "0x4", "--shape", "4x4"], "--shape: shape '0x4': expected dims of at least 1 and at most 2**63 - 1 "
                                           "elements (torch counts them in int64)"),
    (["--shape", f"{2**40}x{2**40}", "--shape", "4x4"], "--shape: shape '1099511627776x1099511627776': expected dims "
                                                        "of at least 1 and at most 2**63 - 1 elements (torch counts "
                                                        "them in int64)"),
])
def test_op_shapes_are_checked(argv, message):
    assert refused("op", "mm", *argv) == f"perfcast op: error: {message}"


def test_argparse_errors_name_the_flag_as_perfcast_does():
    assert refused(*TG, "--dtype", "fp8") == \
        "perfcast text-generate: error: --dtype: invalid choice: 'fp8' (choose from 'bf16', 'fp16', 'fp32')"
