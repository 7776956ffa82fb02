#!/usr/bin/env bash
# The GPU check of issue 26 ("A GPU that pays"): one prepared run. The issue's own checks come first
# and take under 6 minutes (28 Nov's run: setup 16 s, CUDA tests 77, learner speed 30, row chunks
# 17, the two learning comparisons 127; not yet run there: layer products ~15, the switches ~50,
# the replay's gather ~15); then, while
# the 540 s it keeps to leave room (the device tool's timeout_s 560), the compile path's bench,
# dqn-cartpole on the compile path and Pong from pixels, each only where its timeout still fits.
#
# Here first (it fetches the wheels the GPU machine lacks into .whl/, which git ignores; ale-py for
# the Atari step at the end):
#   EXTRA_WHEELS=ale-py bash ../shared/gpu/prepare.sh
# and ale-py's wheel itself, which prepare.sh skips (it takes .venv's versions; .venv has no ale-py):
#   python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl ale-py
# Then on the GPU machine, in the checkout's copy, carrying .whl/ (results under $OUT):
#   bash bench/gpu_check.sh
#
# It runs, each under its own timeout, writing into gpu_check.tgz and summary.txt under $OUT
# (./gpu_check_out without $OUT):
#   setup.log            ../shared/gpu/device_setup.sh: wheels and this project into /tmp/site
#   nvidia-smi.txt       the card, and the processes on it at the start
#   pytest_gpu.txt       tests/trainer/test_update_paths.py, test_splitk.py, test_optim.py,
#                        test_replay_nstep.py and test_encoders.py: the CUDA graph path against eager,
#                        row-chunked gradients against one product, Adam and the target update in
#                        slices against whole tensors, a packed replay against a store per column,
#                        byte rows of a camera beside vectors, a camera's frames kept once
#                        (test_frame_replay.py) on the device and on the graph path
#   layer_products.json  bench/layer_products.py: the twin critics' and DQN's layer ops one by one at
#                        256 and 4,096 rows (which form of a bias gradient, weight gradient and action
#                        pick is cheapest: DQN's batch-4,096 gap to its bar is about 11 us an update)
#   learner_speed.json   bench/learner_speed.py: updates/s of DQN, SAC and PPO's minibatch step,
#                        cpu and cuda, batch 256 and 4,096, eager and graph, on cuda with TF32
#                        products (the default; full float32 was measured on 27 Nov), with the
#                        ratios and the issue's bars (SAC >= 1,000/s, DQN >= 2,500/s at 256;
#                        4,096 >= 0.8x 256)
#   learner_speed_slices.json  DQN, SAC and PPO's graph path at 256 and 4,096 with --adam-slices on,off
#                        (large tensors to the fused Adam and the target update in slices, the
#                        default since 28 Nov, or whole) and --bias-grad sum,product (bias
#                        gradients of >= 1,024 rows as a product with ones; not the default yet),
#                        each row's costliest kernels: SAC's three Adam steps took 103 us of its
#                        483-us update whole (one thread block per 65,536 elements), DQN's bias
#                        sums 17 of its 212 us at 4,096 rows
#   learner_speed_gather.json  DQN and SAC's graph path at 256 and 4,096 with --replay-gather
#                        packed,columns (the replay's columns of one dtype in one storage, one index
#                        op each: the default since 28 Nov, later; or a storage and an op per column)
#   learner_speed_compile.json  DQN and SAC at 256 and 4,096 on the compile path (inductor's kernels
#                        in the learner's own CUDA graph) beside the graph path, in one process
#   learner_speed_chunks.json  SAC's graph and compile paths at 4,096 with grad_row_chunks "auto" (the
#                        twin critics' weight gradients in 8 row chunks on cuda) and 1, with profiles
#   learning_*.json      bench/learning.py dqn-cartpole and sac-pendulum, seed 0, through the bridge,
#                        [run] device "auto" (the GPU) and the same with the GPU hidden
#                        (CUDA_VISIBLE_DEVICES=): wall_s of the first must not exceed the second's
#   learning_*_big.json  the same with device "auto", batch_size 1,024 and updates_per_step 2 (the
#                        presets' GPU guidance), beside them
#   learning_dqn-cartpole_compile.json  the same task with update_path "compile", alone (time left)
#   pixels_pong.json     bench/pixels.py, Pong from pixels for 10k env steps on the GPU (when ale-py
#                        came and time is left)
#   gpu_apps.txt         the processes holding the GPU every 5 s while the learning runs go
#   summary.txt          the figures above in a few lines
set -u
here=$(pwd)
# The files go to a folder of their own and, at every step, into one archive beside summary.txt:
# the device tool brings back at most 8 files from $OUT, and a run cut by its time limit keeps what
# the last step packed.
dest=${OUT:-$here/gpu_check_out}
out=/tmp/gpu_check
rm -rf "$out"; mkdir -p "$out" "$dest"
start=$(date +%s)
pack() { tar czf "$dest/gpu_check.tgz" -C "$out" . 2>/dev/null; cp "$out/summary.txt" "$dest/" 2>/dev/null; }
# The time left of the 540 s the check keeps to (the device tool runs it with timeout_s 560): the
# steps after the learning runs start only where their own timeout still fits.
left() { echo $(( 540 - ($(date +%s) - start) )); }
step() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/summary.txt"; pack; }

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
step "setup"
# device_setup.sh's last line checks an import that moved (simbridge.trainer.learner): a failure
# there is checked again below.
bash .whl/device_setup.sh > "$out/setup.log" 2>&1 || step "device_setup.sh exited non-zero (see setup.log); checking the install"
export PYTHONPATH=/tmp/site
cp -r tests /tmp/run/ 2>/dev/null || true
cd /tmp/run || { step "no /tmp/run: setup failed"; exit 1; }
python3 -c "import torch, simbridge.trainer.learners.capture as c; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" \
  >> "$out/summary.txt" 2>&1 || { step "simbridge.trainer does not import: see setup.log"; exit 1; }

step "pytest: the CUDA graph path (tests/trainer/test_update_paths.py, test_splitk.py, test_optim.py, test_replay_nstep.py, test_encoders.py's CUDA test, test_frame_replay.py)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/trainer/test_update_paths.py tests/trainer/test_splitk.py \
  tests/trainer/test_optim.py tests/trainer/test_replay_nstep.py \
  tests/trainer/test_encoders.py::test_byte_rows_of_a_camera_beside_vectors_update_on_the_cuda_graph_path_as_eagerly \
  tests/trainer/test_frame_replay.py \
  > "$out/pytest_gpu.txt" 2>&1
tail -3 "$out/pytest_gpu.txt" >> "$out/summary.txt"

step "bench/layer_products.py: the layers' ops one by one, 256 and 4,096 rows"
timeout 60 python3 bench/layer_products.py --out "$out/layer_products.json" > /dev/null 2> "$out/layer_products.log"
python3 - "$out/layer_products.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["rows"]:
    print(f'  {x["layer"]} b{x["rows"]} {x["in"]}->{x["out"]}: ' + ", ".join(
        f"{k} {v}" for k, v in x.items() if k.startswith(("bgrad", "pick", "wgrad", "fwd_bmm", "dgrad"))))
for o in r["optimizers"]:
    print(f'  {o["network"]} ({o["parameters"]} parameters): ' + ", ".join(
        f"{k} {o[k]}" for k in ("adam_whole", "adam_sliced", "lerp_whole", "lerp_sliced")))
for g in r["replays"]:
    print(f'  replay {g["learner"]} b{g["rows"]}: {g["columns"]} columns, a store each {g["gather_columns"]} us, '
          f'in {g["stores_packed"]} stores {g["gather_packed"]} us')
EOF

step "bench/learner_speed.py"
timeout 150 python3 bench/learner_speed.py --out "$out/learner_speed.json" > /dev/null 2> "$out/learner_speed.log"
python3 - "$out/learner_speed.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    tf = ("" if x["device"] == "cpu" else " tf32" if x["tf32"] else " fp32")
    print(f'  {x["learner"]} {x["device"]}{tf} b{x["batch"]} {x["path"]}: {x["updates_per_s"]}/s {x["spread"]} cpu {x["cpu_ms_per_update"]} ms')
print("  ratios", json.dumps(r["ratios"]))
print("  targets", json.dumps(r["targets"]))
print("  acting", json.dumps([(a["network"], a["device"], a["rows"], a["us_per_call"]) for a in r["acting"]]))
EOF

step "bench/learner_speed.py --adam-slices on,off --bias-grad sum,product: the graph path, with profiles"
timeout 120 python3 bench/learner_speed.py --devices cuda --learners dqn,sac,ppo --paths graph --adam-slices on,off --bias-grad sum,product \
  --window 0.1 --repeats 3 --no-acting --profile 8 --out "$out/learner_speed_slices.json" > /dev/null 2> "$out/learner_speed_slices.log"
python3 - "$out/learner_speed_slices.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    print(f'  {x["learner"]} b{x["batch"]} {x["path"]} slices {x["adam_slices"]} bias {x["bias_grad"]}: {x["updates_per_s"]}/s {x["spread"]}; ' + "; ".join(
        f'{p["op"][:60]} {p["self_us_per_update"]} us x{p["calls_per_update"]}' for p in x["profile"][:6]))
print("  ratios", json.dumps({k: v for k, v in r["ratios"].items() if "slices" in k or "bias" in k or "b4096_vs" in k}))
# what the two switches' rows say, in a line each (a switch pays: its rate over the other's > 1)
rat = r["ratios"]
def rows(suffix):
    return {k.rsplit("/", 1)[0]: v for k, v in rat.items() if k.endswith("/" + suffix)}
off = rows("slicesoff_vs_on")
if off:
    word = "keep" if all(v < 1.0 for v in off.values()) else "drop" if all(v > 1.02 for v in off.values()) else "mixed:"
    print(f"  VERDICT Adam in slices (optim.SLICED_DEVICES = ('cuda',)): {word} {json.dumps(off)}")
prod = rows("biasproduct_vs_sum")
if prod:
    big = [v for k, v in prod.items() if "/b4096/" in k]
    small = [v for k, v in prod.items() if "/b256/" in k]
    pays = big and all(v >= 1.02 for v in big) and all(v >= 0.98 for v in small)
    word = "set splitk.BIAS_BY_PRODUCT = ('cuda',)" if pays else "leave splitk.BIAS_BY_PRODUCT empty"
    print(f"  VERDICT bias gradients as products: {word} {json.dumps(prod)}")
for k, v in rat.items():
    if k.endswith("/graph/b4096_vs_b256"):
        print(f"  BAR {k}: {v} (>= 0.8: {'met' if v >= 0.8 else 'not met'})")
EOF

step "bench/learner_speed.py --replay-gather packed,columns: DQN and SAC's graph path, the replay's columns packed by dtype or a store each"
# DQN's five per-column gathers were about 18 us of its 4,096-row update (28 Nov's profile); packed,
# its float columns are one index op and its actions another (trainer/learners/replay.py's PACK,
# the default since 28 Nov, later)
timeout 60 python3 bench/learner_speed.py --devices cuda --learners dqn,sac --paths graph --replay-gather packed,columns \
  --window 0.1 --repeats 3 --no-acting --out "$out/learner_speed_gather.json" > /dev/null 2> "$out/learner_speed_gather.log"
python3 - "$out/learner_speed_gather.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    print(f'  {x["learner"]} b{x["batch"]} {x["path"]} gather {x["replay_gather"]}: {x["updates_per_s"]}/s {x["spread"]}')
cols = {k: v for k, v in r["ratios"].items() if k.endswith("/gathercolumns_vs_packed")}
word = "keep" if cols and all(v < 1.0 for v in cols.values()) else "drop" if cols and all(v > 1.02 for v in cols.values()) else "mixed:"
print(f"  VERDICT replay columns packed by dtype (replay.PACK = True): {word} {json.dumps(cols)}")
for k, v in r["ratios"].items():
    if k.endswith("/graph/b4096_vs_b256"):
        print(f"  BAR {k} (packed): {v} (>= 0.8: {'met' if v >= 0.8 else 'not met'})")
EOF

step "bench/learner_speed.py --grad-row-chunks auto,1: SAC at batch 4,096, graph and compile, chunked twin gradients against one product"
# "auto" (the default since 28 Nov) sums the twin critics' weight gradients in 8 row chunks on cuda:
# on the H200 a twin layer's gradient over 4,096 rows took 40 us as one batched product, 10-14.5 us
# in chunks (cuBLAS splits 2-D products' rows itself, not batched ones'). chunks1_vs_auto < 1 where
# "auto" pays; the profiles show whether the 40-us kernels went and whether the compile path fused
# the twin layers' bias into the relu (no strided copies x9).
timeout 90 python3 bench/learner_speed.py --devices cuda --learners sac --batches 4096 --paths graph,compile \
  --grad-row-chunks auto,1 --window 0.1 --no-acting --profile 12 --out "$out/learner_speed_chunks.json" \
  > /dev/null 2> "$out/learner_speed_chunks.log"
python3 - "$out/learner_speed_chunks.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for x in r["results"]:
    print(f'  {x["learner"]} b{x["batch"]} {x["path"]} chunks {x["grad_row_chunks"]}: {x["updates_per_s"]}/s {x["spread"]}; ' + "; ".join(
        f'{p["op"][:60]} {p["self_us_per_update"]} us x{p["calls_per_update"]}' for p in x["profile"][:6]))
print("  ratios", json.dumps(r["ratios"]))
EOF

# the processes holding the GPU while the learning runs go (one context expected: the learner process's)
( while true; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
    2>/dev/null | sed "s/^/$(date +%s) /"; sleep 5; done ) > "$out/gpu_apps.txt" &
apps=$!
for task in dqn-cartpole sac-pendulum; do
  # the two runs of a task side by side (16 cores; each uses about three): the same load for both,
  # and half the device time. TMPDIR apart, so that each run's processes.log can be found.
  step "bench/learning.py $task seed 0: device auto and, beside it, the GPU hidden"
  # and a third beside them: the presets' GPU guidance (presets.py: a larger batch, a higher replay
  # ratio), one seed, to see what it does to the target's wall time and env steps
  pids=""
  for mode in auto cpu big; do
    mkdir -p "/tmp/lrn_$mode"
    hide=""; extra=""
    [ "$mode" = cpu ] && hide="CUDA_VISIBLE_DEVICES="
    [ "$mode" = big ] && extra="--set batch_size=1024 --set updates_per_step=2"
    env $hide TMPDIR="/tmp/lrn_$mode" timeout 130 python3 bench/learning.py "$task" --seed 0 --no-inprocess --keep-run-dir $extra \
      --log-level INFO --timeout 90 --out "$out/learning_${task}_$mode.json" > /dev/null 2> "$out/learning_${task}_$mode.log" &
    pids="$pids $!"
  done
  wait $pids   # not a bare wait: the sampling loop above never ends
  for mode in auto cpu big; do
    # the daemon's and simulators' output (the update path, a capture that fell back, a GPU shared)
    cp "$(ls -td /tmp/lrn_$mode/simbridge-"$task"-* 2>/dev/null | head -1)/processes.log" \
      "$out/processes_${task}_$mode.log" 2>/dev/null
  done
  python3 - "$out/learning_${task}_auto.json" "$out/learning_${task}_cpu.json" "$out/learning_${task}_big.json" \
    >> "$out/summary.txt" 2>&1 <<'EOF2'
import json, sys
a, c = (json.load(open(p)) for p in sys.argv[1:3])
print(f'  auto: solved {a["solved"]} at {a["env_steps"]} steps in {a["wall_s"]} s; hidden: solved {c["solved"]} at '
      f'{c["env_steps"]} steps in {c["wall_s"]} s; auto/hidden wall {a["wall_s"] / c["wall_s"]:.2f} (bar: <= 1), '
      f'per env step {a["wall_s"] / a["env_steps"] / (c["wall_s"] / c["env_steps"]):.2f}')
b = json.load(open(sys.argv[3]))
print(f'  auto, batch 1024 and 2 updates per step: solved {b["solved"]} at {b["env_steps"]} steps in {b["wall_s"]} s '
      f'({sum(b["updates"].values())} updates)')
EOF2
done
kill "$apps" 2>/dev/null
grep -h -E "updates run|learns on|also use|WARNING|Traceback|Error" "$out"/processes_*.log 2>/dev/null | sed -E "s/^[0-9-]+ [0-9:,]+ //" | sort | uniq -c | head -20 \
  >> "$out/summary.txt"

if [ "$(left)" -ge 120 ]; then
  step "bench/learner_speed.py: the compile path (inductor's kernels captured as one CUDA graph) beside the graph path"
  # fused element-wise kernels, where the graph path runs one kernel per op (tens of seconds of
  # compiling per learner and batch; measured twice on 28 Nov, so it waits for time left). Rows are read from the log,
  # one JSON line per row as it ends, so that a row cut by the timeout does not lose the ones before.
  timeout "$(( $(left) < 200 ? $(left) : 200 ))" python3 bench/learner_speed.py --devices cuda --paths graph,compile --learners dqn,sac --window 0.2 \
    --no-acting --out "$out/learner_speed_compile.json" > /dev/null 2> "$out/learner_speed_compile.log"
  grep -h '^{"learner"' "$out/learner_speed_compile.log" | python3 -c "
import json, sys
for line in sys.stdin:
    x = json.loads(line)
    print(f'  {x[\"learner\"]} b{x[\"batch\"]} {x[\"path_asked\"]}->{x[\"path\"]}: {x[\"updates_per_s\"]}/s warmup {x[\"warmup_s\"]} s')
" >> "$out/summary.txt" 2>&1
  python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print('  ratios', r['ratios']); print('  targets', r['targets'])" \
    "$out/learner_speed_compile.json" >> "$out/summary.txt" 2>&1
  grep -h -E "updates run eagerly from now on|without a CUDA graph" "$out/learner_speed_compile.log" | cut -c1-300 >> "$out/summary.txt"
fi

# The compile path through the bridge (README's advice for long runs): dqn-cartpole with
# update_path "compile", alone on the GPU, where time is left: the learner process's start-up lines
# (the build's seconds, a fall-back) and the target's wall time against the graph path's above
if [ "$(left)" -ge 110 ]; then
  step "bench/learning.py dqn-cartpole seed 0, update_path compile"
  mkdir -p /tmp/lrn_compile
  TMPDIR=/tmp/lrn_compile timeout 110 python3 bench/learning.py dqn-cartpole --seed 0 --no-inprocess --keep-run-dir \
    --set 'update_path="compile"' --log-level INFO --timeout 90 --out "$out/learning_dqn-cartpole_compile.json" \
    > /dev/null 2> "$out/learning_dqn-cartpole_compile.log"
  cp "$(ls -td /tmp/lrn_compile/simbridge-dqn-cartpole-* 2>/dev/null | head -1)/processes.log" \
    "$out/processes_dqn-cartpole_compile.log" 2>/dev/null
  python3 - "$out/learning_dqn-cartpole_compile.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
print(f'  compile: solved {c["solved"]} at {c["env_steps"]} steps in {c["wall_s"]} s')
EOF
  grep -h -E "updates run|torch.compile built|eagerly from now on" "$out/processes_dqn-cartpole_compile.log" 2>/dev/null \
    | sed -E "s/^[0-9-]+ [0-9:,]+ //" | head -4 >> "$out/summary.txt"
fi

# Pong from pixels on the GPU (the Nature CNN: an image network learns and acts on the GPU), where
# time is left and ale-py came along (EXTRA_WHEELS=ale-py for prepare.sh): the throughput against the
# CPU's 8.4 env steps/s (docs/benchmarks.md); 10k env steps learn nothing yet. At most 70 s.
if [ "$(left)" -ge 70 ] && python3 -c "import ale_py" 2>/dev/null; then
  step "bench/pixels.py: Pong from pixels, 10k env steps, device auto"
  TMPDIR=/tmp/lrn_auto timeout 70 python3 bench/pixels.py --env-steps 10000 --timeout-s 60 \
    --out "$out/pixels_pong.json" > /dev/null 2> "$out/pixels_pong.log"
  python3 - "$out/pixels_pong.json" >> "$out/summary.txt" 2>&1 <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f'  {r["env_steps"]} env steps, {r["updates"]} updates in {r["wall_s"]} s: {r["env_steps_per_s"]} env steps/s; '
      f'return(10) {r["final_return_mean_10"]}')
EOF
  cp "$(ls -td /tmp/lrn_auto/simbridge-pixels-* 2>/dev/null | head -1)/processes.log" "$out/processes_pixels.log" 2>/dev/null
fi
# A camera's frames kept once, on the device: a sample's gather and transpose against a rows
# replay's, at the 4,096-row batch of the issue's bar (docs/benchmarks.md, bench/replay_frames.py).
if [ "$(left)" -ge 40 ]; then
  step "bench/replay_frames.py --device cuda --sample-batch 4096: frames against rows on the GPU"
  timeout 40 python3 bench/replay_frames.py --device cuda --sample-batch 4096 --repeats 1 --capacity 5000 \
    --cases atari,atari_sim,camera --out "$out/replay_frames_cuda.json" > /dev/null 2> "$out/replay_frames_cuda.log"
  python3 -c "import json, sys; r = json.load(open(sys.argv[1])); [print(f'  {x[\"case\"]} {x[\"store\"]}: {x[\"sample_ms\"]} ms a sample of 4,096') for x in r['results']]; print('  ratios', r['ratios'])" \
    "$out/replay_frames_cuda.json" >> "$out/summary.txt" 2>&1
fi
nvidia-smi >> "$out/nvidia-smi.txt" 2>&1 || true
step "done"
cat "$out/summary.txt"
