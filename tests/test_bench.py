"""bench/ as a package: scripts that run from the checkout, a case registry that makes their help,
and every documented `bench/throughput.py` command still one the script takes.

No case is run here (each starts servers and measures for seconds: bench/throughput.py is the
benchmark); these check the command line and the registry in a real process of the script.
"""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 440   # tests/test_layout.py's "~400" for the installed rooms
# the commands the docs show, continuation lines and all, up to a closing backtick or a comment
COMMAND = re.compile(r"bench/throughput\.py((?:[^\n`#]*\\\n)*[^\n`#]*)")
PLACEHOLDER = "..."    # docs/benchmarks.md's "--cases ...same...": the command before it, again

CHECK = """
import json, sys
from bench import cases, throughput
bad = []
for args in json.loads(sys.argv[1]):
    try:
        got = throughput.parser().parse_args(args)
        cases.resolve(got.cases)
    except (SystemExit, ValueError) as e:
        bad.append([args, repr(e)])
print(json.dumps(bad))
"""


def documented_commands():
    found = {}
    for path in [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in COMMAND.finditer(path.read_text()):
            args = shlex.split(m.group(1).replace("\\\n", ""))
            if any(PLACEHOLDER in a for a in args):
                continue
            found.setdefault(f"{path.name}: {' '.join(args)}", args)
    return found


def run(*args, timeout=120):
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_every_documented_throughput_command_takes_known_flags_and_cases():
    commands = documented_commands()
    assert len(commands) >= 10, f"the docs' commands were not found: {sorted(commands)}"
    assert any("--cases" in args for args in commands.values())
    bad = json.loads(run("-c", CHECK, json.dumps(list(commands.values()))))
    assert not bad, f"documented commands the script refuses: {bad}"


def test_an_unknown_case_is_refused_with_the_way_to_the_list():
    out = subprocess.run([sys.executable, "bench/throughput.py", "--cases", "stream,no_such_case"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert "no_such_case" in out.stderr and "--list" in out.stderr, out.stderr


def test_help_and_list_are_made_from_the_case_docstrings():
    listed = run("bench/throughput.py", "--list").splitlines()
    names = [line.split()[0] for line in listed]
    assert len(names) == len(set(names)) >= 40
    assert all(len(line.split(None, 1)) == 2 for line in listed), "a case without its line"
    helped = run("-m", "bench.throughput", "--help")
    for name in names:
        assert re.search(rf"\b{name}\b", helped), f"{name} missing from --help"
    # the texts are the functions' docstrings
    assert "what this machine allows per round trip" in helped     # bench/echo.py's floor
    assert "SIMBRIDGE_GRPC_STREAM=iterator" in helped               # the iter_ family's text


def test_bench_modules_stay_near_400_lines():
    big = {p.name: n for p in (ROOT / "bench").glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not big, f"bench modules that hold two jobs: {big}"


def test_learner_speed_runs_on_the_cpu_and_reports_rates_and_profiles(tmp_path):
    """bench/learner_speed.py is what the GPU check runs: on the CPU it must run too, one row per
    learner (eager: the CPU's only path) and, with --profile, each row's costliest ops."""
    out = tmp_path / "speed.json"
    run("bench/learner_speed.py", "--learners", "dqn,ppo", "--batches", "64", "--window", "0.02",
        "--repeats", "1", "--no-acting", "--profile", "3", "--tf32", "both", "--out", str(out))
    report = json.loads(out.read_text())
    rows = {(r["learner"], r["batch"]): r for r in report["results"]}
    assert set(rows) == {("dqn", 64), ("ppo", 64)}   # one row each: --tf32 both is cuda's
    for r in rows.values():
        assert r["device"] == "cpu" and r["path"] == "eager" and r["tf32"] is False and r["updates_per_s"] > 0
        assert len(r["profile"]) == 3 and all(p["self_us_per_update"] > 0 for p in r["profile"])
    assert report["targets"] == {}   # the bars are cuda's


def test_replay_frames_sets_each_store_beside_the_other_per_camera(tmp_path):
    """bench/replay_frames.py: both replay stores take the same transitions; kept as frames, a
    stack of 4 takes a fifth of its rows' bytes and holds as many rows."""
    out = tmp_path / "frames.json"
    run("bench/replay_frames.py", "--capacity", "300", "--agents", "3", "--episode", "30", "--repeats", "1",
        "--cases", "atari,robot", "--out", str(out))
    report = json.loads(out.read_text())
    rows = {(r["case"], r["store"]): r for r in report["results"]}
    assert set(rows) == {(c, s) for c in ("atari", "robot") for s in ("rows", "frames")}
    assert all(r["rows_held"] == 300 and r["add_us_per_transition"] > 0 and r["sample_ms"] > 0 for r in rows.values())
    assert report["ratios"]["atari"]["bytes_frames_vs_rows"] < 0.2
    assert report["ratios"]["robot"]["bytes_frames_vs_rows"] < 0.7


def test_layer_products_times_every_formulation_of_each_layer(tmp_path):
    """bench/layer_products.py (the twin critics' and DQN's layer ops, one by one: the GPU check's
    evidence for "auto" grad_row_chunks and for the bias gradients' form): on the CPU it runs too, a
    time for every formulation of every layer, the chunked gradients only where the rows allow them
    (splitk.MIN_ROWS), the action pick on DQN's last layer only."""
    out = tmp_path / "layers.json"
    run("bench/layer_products.py", "--rows", "64,1024", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["layer"], r["rows"], r["in"], r["out"]) for r in rows] == [
        ("twin", n, i, o) for n in (64, 1024) for i, o in ((4, 256), (256, 256), (256, 1))] + [
        ("plain", n, i, o) for n in (64, 1024) for i, o in ((4, 128), (128, 128), (128, 2))]
    for r in rows:
        times = {k: v for k, v in r.items() if k not in ("layer", "rows", "in", "out")}
        assert all(v > 0 for v in times.values())
        if r["layer"] == "twin":
            assert {"fwd_baddbmm_relu", "fwd_bmm_add_relu", "wgrad_bmm", "bgrad_sum", "bgrad_bmm_ones"} <= set(times)
            assert ("wgrad_chunks8" in times) == (r["rows"] >= 1024)
        else:
            assert {"fwd_addmm_relu", "wgrad_mm", "bgrad_sum", "bgrad_mv_ones", "bgrad_mm_ones"} <= set(times)
            assert ("pick_gather" in times) == ("pick_onehot" in times) == (r["out"] == 2)
    optimizers = json.loads(out.read_text())["optimizers"]
    assert [(o["network"], o["parameters"]) for o in optimizers] == [
        ("sac_twin_critic", 134_658), ("sac_actor", 67_330), ("dqn_q", 17_410)]   # the presets' networks
    assert all(o[k] > 0 for o in optimizers for k in ("adam_whole", "adam_sliced", "lerp_whole", "lerp_sliced"))


def test_learner_speed_ratios_set_each_path_beside_eager_and_compile_beside_graph():
    """The GPU check decides the compile path against the graph path from these ratios, and the
    batch question from b4096_vs_b256 per path."""
    from bench.learner_speed import ratios
    rates = {("eager", 256): 200.0, ("graph", 256): 2000.0, ("compile", 256): 2500.0,
             ("graph", 4096): 1200.0, ("compile", 4096): 2000.0}
    rows = [{"learner": "sac", "device": "cuda:0", "batch": b, "path_asked": p, "tf32": True, "updates_per_s": r}
            for (p, b), r in rates.items()]
    got = ratios(rows)
    assert got["sac/cuda:0/tf32/b256/graph_vs_eager"] == 10.0
    assert got["sac/cuda:0/tf32/b256/compile_vs_graph"] == 1.25
    assert got["sac/cuda:0/tf32/b4096/compile_vs_graph"] == 1.667
    assert got["sac/cuda:0/tf32/compile/b4096_vs_b256"] == 0.8
    assert got["sac/cuda:0/tf32/graph/b4096_vs_b256"] == 0.6
    assert "sac/cuda:0/tf32/b4096/compile_vs_eager" not in got   # no eager row at 4,096


def test_learner_speed_sets_row_chunked_gradients_beside_one_product_and_its_bar_takes_the_faster():
    """The GPU check's grad_row_chunks rows (trainer/learners/splitk.py): a ratio each against
    the default ("auto"), kept out of the path ratios, and the 4,096 bar met by the fastest setting."""
    from bench.learner_speed import ratios, targets
    rows = [{"learner": "dqn", "device": "cuda:0", "batch": b, "path_asked": "graph", "tf32": True,
             "grad_row_chunks": k, "updates_per_s": r}
            for b, k, r in ((256, "auto", 6000.0), (4096, "auto", 4500.0), (4096, 8, 5100.0), (4096, 32, 4000.0))]
    got = ratios(rows)
    assert got["dqn/cuda:0/tf32/b4096/graph/chunks8_vs_auto"] == 1.133
    assert got["dqn/cuda:0/tf32/b4096/graph/chunks32_vs_auto"] == 0.889
    assert got["dqn/cuda:0/tf32/graph/b4096_vs_b256"] == 0.75   # the default against the default
    t = targets(rows)["dqn"]
    assert (t["b4096"], t["b4096_grad_row_chunks"], t["b4096_met"]) == (5100.0, 8, True)


def test_learner_speed_sets_adam_slices_and_bias_products_beside_the_defaults_out_of_the_other_ratios():
    """The GPU check's adam_slices rows (trainer/learners/optim.py: large tensors to the fused Adam in
    slices on cuda, the default) and bias_grad rows (splitk.BIAS_BY_PRODUCT): each against the
    default per row, and kept out of the path, batch and chunk ratios and the batch-256 bar."""
    from bench.learner_speed import ratios, targets
    rows = [{"learner": "sac", "device": "cuda:0", "batch": b, "path_asked": "graph", "tf32": True,
             "grad_row_chunks": k, "adam_slices": s, "bias_grad": bg, "updates_per_s": r}
            for b, k, s, bg, r in ((256, "auto", "on", "sum", 2500.0), (256, "auto", "off", "sum", 2000.0),
                                   (4096, "auto", "on", "sum", 1300.0), (4096, "auto", "off", "sum", 1200.0),
                                   (4096, 1, "off", "sum", 1100.0), (4096, "auto", "on", "product", 1430.0))]
    got = ratios(rows)
    assert got["sac/cuda:0/tf32/b256/graph/slicesoff_vs_on"] == 0.8
    assert got["sac/cuda:0/tf32/b4096/graph/slicesoff_vs_on"] == 0.923
    assert got["sac/cuda:0/tf32/b4096/graph/chunks1_vs_auto_slicesoff_vs_on"] == 0.846
    assert got["sac/cuda:0/tf32/b4096/graph/biasproduct_vs_sum"] == 1.1
    assert got["sac/cuda:0/tf32/graph/b4096_vs_b256"] == 0.52   # on against on
    assert targets(rows)["sac"]["best_b256"] == 2500.0


def test_profile_rows_name_cuda_kernels_by_what_tells_them_apart():
    """The fused Adam and every _foreach_ op are all `multi_tensor_apply_kernel<...>` (90 characters
    of namespaces alike): a profile row names the functor, the GPU check's summary reads it."""
    from bench.learner_speed import kernel_name
    ns = "at::native::(anonymous namespace)::"
    adam = (f"void {ns}multi_tensor_apply_kernel<{ns}FusedOptimizerTensorListMetadata<4>, "
            f"{ns}FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)0, false>, bool, float*>(...)")
    lerp = (f"void {ns}multi_tensor_apply_kernel<{ns}TensorListMetadata<2>, {ns}TernaryOpScalarFunctor<float, 2, "
            f"2, 0>, at::native::LerpFunctor<float>, float>(...)")
    assert kernel_name(adam) == "multi_tensor_apply_kernel<FusedAdamMathFunctor>"
    assert kernel_name(lerp) == "multi_tensor_apply_kernel<TernaryOpScalarFunctor/LerpFunctor>"
    assert kernel_name("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<"
                       "float, at::native::sum_functor<float, float, float>>>>(...)") == "reduce_kernel<sum_functor>"
    assert kernel_name("aten::addmm") == "aten::addmm"
    assert len(kernel_name("void cutlass::Kernel2<" + "x" * 200 + ">")) == 90


def test_a_bench_ends_with_its_json_printed_and_in_the_out_file_whose_folder_it_makes(tmp_path, capsys):
    from bench.report import emit
    out = tmp_path / "new" / "r.json"
    assert emit({"rate": 1.5}, str(out), indent=1) == 0
    assert json.loads(out.read_text()) == json.loads(capsys.readouterr().out) == {"rate": 1.5}
    assert emit({"rate": 2}) == 0 and json.loads(capsys.readouterr().out) == {"rate": 2}


def test_the_gpu_checks_python_blocks_compile_here():
    """bench/gpu_check.sh runs only on a lent GPU machine: a syntax error in one of its summary
    blocks (an f-string with a backslash, on the VM's Python 3.11) would cost a GPU session's run."""
    text = (ROOT / "bench" / "gpu_check.sh").read_text()
    blocks = re.findall(r"<<'(EOF2?)'\n(.*?)\n\1\n", text, re.S)
    assert len(blocks) == 8
    for _, code in blocks:
        compile(code, "bench/gpu_check.sh", "exec")


# Every other bench's documented commands: in code blocks and in inline code (which may wrap once).
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INDENTED = re.compile(r"^    \S.*$", re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]*(?:\n[^`\n]*)?)`(?!`)")
BENCH = re.compile(r"(python\S* )?bench/(\w+)\.py((?:[^\n#|;&>`]*\\\n)*[^\n#|;&>`]*)")
PLACEHOLDERS = re.compile(r"^[A-Z][A-Z_]*$|\[|\.\.\.|^<")   # TASK, N, [--seed S], ...

PARSE_ONLY = """
import argparse, json, runpy, sys
class Parsed(Exception):
    pass
def parsed(original):
    def parse(self, *a, **k):
        original(self, *a, **k)
        raise Parsed()
    return parse
argparse.ArgumentParser.parse_args = parsed(argparse.ArgumentParser.parse_args)
argparse.ArgumentParser.parse_known_args = parsed(argparse.ArgumentParser.parse_known_args)
bad = []
for name, args in json.loads(sys.argv[1]):
    sys.argv = [f"bench/{name}.py", *args]
    try:
        runpy.run_path(f"bench/{name}.py", run_name="__main__")
        bad.append([name, args, "returned without parsing its command line"])
    except Parsed:
        pass
    except SystemExit as e:
        bad.append([name, args, f"exit {e.code}"])
print(json.dumps(bad))
"""


def documented_bench_commands():
    found = {}
    for path in [ROOT / "README.md", ROOT / "DEVELOPERS.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        prose = FENCED.sub("", text)
        # code: a command a line (continued by a backslash); inline code: one command, wrapped once
        pieces = FENCED.findall(text) + INDENTED.findall(prose) + \
            [m.group(1).replace("\n", " ") for m in INLINE.finditer(prose)]
        for piece in pieces:
            for m in BENCH.finditer(piece):
                python, name, rest = m.groups()
                args = shlex.split(rest.replace("\\\n", " "))
                if name == "throughput" or not (python or args) or any(PLACEHOLDERS.search(a) for a in args):
                    continue   # throughput.py has its own test; a bare file name is no command
                found.setdefault(f"{path.name}: bench/{name}.py {' '.join(args)}", [name, args])
    return found


def test_every_documented_bench_command_takes_its_flags():
    """Each command a reader copies from the docs parses (the script stops right after parsing):
    a renamed or dropped flag fails here, not in a reader's terminal."""
    commands = documented_bench_commands()
    names = {name for name, _ in commands.values()}
    assert len(commands) >= 40 and {"learning", "learner_speed", "soak", "fuzz", "pixels"} <= names, sorted(commands)
    for name in names:
        assert "parse_args(" in (ROOT / "bench" / f"{name}.py").read_text(), f"bench/{name}.py would run, not parse"
    bad = json.loads(run("-c", PARSE_ONLY, json.dumps(list(commands.values())), timeout=240).splitlines()[-1])
    assert not bad, f"documented commands a bench refuses: {bad}"
