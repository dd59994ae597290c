#!/usr/bin/env bash
# The GPU measurements of issues 11, 22 and 27, prepared as one script for a session with a GPU. Run
# from the project root on the GPU machine:
#
#   BUDGET=560 bash benchmarks/gpu_session.sh [PHASE ...]   # default: every phase, in priority order
#
# Phases: env gputests xd xdsteps xdcapture tests pool compiled profile graphs mps context steps search, in the
# order of what the last GPU session (stop 38, an H100) left unmeasured: XD's GPU path (xd, xdsteps)
# was built after it, the suite (tests) ran out of time at 99%, and steps and search (issue 22's Ray
# run) were measured there. Each phase has its own time limit, cut to what is left of BUDGET seconds
# (default 560), so the script ends inside one command of the device tool; a phase with under 20 s
# left is skipped. Everything goes to one log,
# $OUT/session.log (the device tool's output folder; ./gpu_session_out elsewhere), and the pool runs
# also to $OUT/<phase>.json: at most eight files come back from the device.
# On an offline machine whose Python has torch: put the wheels from ../shared/tools/gpu/prepare-wheels.sh
# in .whl/ with a copy of ../shared/tools/gpu/install.sh, carry .whl, and this script installs them.
set -uo pipefail
OUT=${OUT:-gpu_session_out}
BUDGET=${BUDGET:-560}
mkdir -p "$OUT"
LOG="$OUT/session.log"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
phases=${*:-env gputests xd xdsteps xdcapture tests pool compiled profile graphs mps context steps search}

if ! "$PY" -c "import einspace.search, ray, lark" 2>/dev/null; then
  bash .whl/install.sh 2>&1 | tee -a "$LOG"
fi

run() {  # run NAME SECONDS COMMAND...: a phase under a time limit (cut to the budget left), logged
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - SECONDS - 5))
  if ((left < 20)); then
    echo "== $name: skipped, ${left} s of the budget left" | tee -a "$LOG"
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit} s, at ${SECONDS} s): $*" | tee -a "$LOG"
  local started=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n 30
  echo "   $name: exit ${PIPESTATUS[0]} after $((SECONDS - started)) s" | tee -a "$LOG"
}

for phase in $phases; do
  case $phase in
  env)  # the card, the driver, torch and ray
    run env 60 bash -c "nvidia-smi; $PY -c 'import torch, ray; print(torch.__version__, torch.version.cuda, ray.__version__, torch.cuda.get_device_name())'"
    ;;
  gputests)  # the GPU tests, and the training, worker and XD tests with CUDA present
    run gputests 90 "$PY" -m pytest -q -p no:cacheprovider -m "gpu or not slow" tests/test_training.py \
      tests/test_workers.py tests/test_xd.py
    ;;
  tests)  # the whole default suite with CUDA present (device: auto picks the GPU), in parallel; -v names
    # each failure in the log as it happens, so a run cut by the time limit still says which failed
    run tests 240 "$PY" -m pytest -v -p no:cacheprovider -n 15 --maxfail 10 tests
    ;;
  search)  # issue 22: the search benchmark unchanged through Ray, four evaluations sharing the GPU
    run search 150 "$PY" benchmarks/search_efficiency.py --quick --tasks digits --methods RE RE+SH \
      --executor ray --num-gpus 0.25 --jobs 4 --out /tmp/search_efficiency
    ;;
  xd)  # issues 9 and 27: XD-operations against the convolution and the FFT convolution, on the GPU
    run xd 60 "$PY" benchmarks/extra_terminals.py --device cuda --only XD --repeats 20
    ;;
  context)  # what a worker process holds on its GPU before its first tensor (packing.PROCESS_BYTES)
    run context 60 "$PY" - <<'EOF'
import os, subprocess, torch, torch.nn.functional as F
torch.cuda.synchronize()
x = torch.randn(64, 16, 32, 32, device="cuda", requires_grad=True)
w = torch.randn(16, 16, 3, 3, device="cuda", requires_grad=True)
with torch.autocast("cuda", dtype=torch.bfloat16):
    F.conv2d(x, w, padding=1).flatten(1).matmul(torch.randn(16384, 10, device="cuda")).sum().backward()
torch.cuda.synchronize()
query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
used = {int(p): int(m) for p, m in (line.split(", ") for line in subprocess.check_output(query, text=True).splitlines())}
mib = 2**20
print(f"process {used.get(os.getpid())} MiB on the device, of which torch allocated "
      f"{torch.cuda.memory_allocated() / mib:.0f} MiB and reserved {torch.cuda.memory_reserved() / mib:.0f} MiB")
EOF
    ;;
  pool)  # persistent workers against fresh processes: 48 evaluations, 8 per GPU (the issue's task)
    run pool 200 "$PY" benchmarks/gpu_pool.py --device cuda --evaluations 48 --in-flight 8 --json "$OUT/pool.json"
    ;;
  graphs)  # the same with CUDA graphs for the training steps, persistent workers only
    run graphs 90 "$PY" benchmarks/gpu_pool.py --device cuda --evaluations 24 --in-flight 8 --modes persistent \
      --settings '{"step_mode": "cuda_graphs"}' --json "$OUT/graphs.json"
    ;;
  mps)  # the same under NVIDIA MPS (kernels of the 8 processes run concurrently instead of time-sliced)
    if command -v nvidia-cuda-mps-control >/dev/null; then
      export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      timeout 10 nvidia-cuda-mps-control -d
      run mps 90 "$PY" benchmarks/gpu_pool.py --device cuda --evaluations 24 --in-flight 8 --modes persistent \
        --json "$OUT/mps.json"
      echo quit | timeout 10 nvidia-cuda-mps-control
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    else
      echo "== mps: nvidia-cuda-mps-control not found, skipped" | tee -a "$LOG"
    fi
    ;;
  xdsteps)  # issue 27: a network of XD-operations trained eagerly and from CUDA graphs (cached permutations)
    run xdsteps 90 "$PY" benchmarks/step_modes.py --network xd --batch 128 --train 2560 \
      --modes eager cuda_graphs eager
    ;;
  xdcapture)  # issue 27: which lone-XDConv captures fail (stop 38 saw the backward capture fail outside
    # autocast, while a whole XD network under autocast captured): each case in its own process, since a
    # failed capture leaves the process unable to capture again
    for case in "plain no-grad" "plain grad" "autocast no-grad" "autocast grad"; do
      run "xdcapture $case" 30 "$PY" - "$case" <<'EOF'
import sys
import torch
from einspace.ops._xd_modules import XDConv

mode, grad = sys.argv[1].split()
xd = XDConv(16, 16, 3, (32, 32), padding=1, device="cuda")
x = torch.randn(8, 16, 32, 32, device="cuda", requires_grad=grad == "grad")
try:
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast", cache_enabled=False):
        graphed = torch.cuda.make_graphed_callables(xd, (x,))
    graphed(x).float().square().mean().backward()
    torch.cuda.synchronize()
    print(f"{sys.argv[1]}: captured and replayed")
except RuntimeError as exc:
    print(f"{sys.argv[1]}: FAILED: {str(exc).splitlines()[0]}")
EOF
    done
    ;;
  steps)  # one small network, one process: time per step under each step mode (host round trips)
    run steps 100 "$PY" benchmarks/step_modes.py --network resnet_small
    ;;
  profile)  # where the lowered seeds' extra step time goes on the GPU: kernels of one step, each model
    run profile 90 "$PY" - <<'EOF'
import sys
sys.path.insert(0, "benchmarks")
import torch
import compiled_vs_handwritten as cvh
from torch.profiler import ProfilerActivity, profile

cvh.DEVICE = torch.device("cuda")
for seed in ("mlp_mixer", "resnet18"):
    models = cvh.build(seed)
    del models["literal"]
    x, y = cvh.to_device(models, torch.randn(256, *cvh.SHAPE), torch.randint(0, 10, (256,)))
    for name, model in models.items():
        for _ in range(3):
            cvh.step(model, x, y)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            cvh.step(model, x, y)
        print(f"== {seed} {name}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
EOF
    ;;
  compiled)  # lowered seeds against hand-written models per training step (target: <= 1.10x)
    run compiled 100 "$PY" benchmarks/compiled_vs_handwritten.py --device cuda --batch 256 --repeats 20 --threads 0
    ;;
  *) echo "unknown phase $phase" ;;
  esac
done
