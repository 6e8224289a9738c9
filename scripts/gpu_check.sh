#!/usr/bin/env bash
# The trainer on a real GPU, end to end, in one go (about 8 minutes on an H100):
#   1. scripts/bench_trainer.py on nanoGPT's two shapes (tok/s, ms/step, MFU, peak memory), with a
#      calibration entry per shape appended to OUT/calibration.yaml;
#   2. `gpucli launch --provider local --profile h100 --phase fast`: a 124M model on the demo corpus
#      for STEPS steps, watched with `gpucli status` / `tail --no-follow`, harvested with `fetch-best`;
#   3. the same run resumed from its newest checkpoint for RESUME_STEPS more steps;
#   4. `gpucli export` of its best checkpoint (Hugging Face layout, loaded back with transformers when
#      installed) and, where vLLM is installed, `gpucli serve demo --on-pod --engine vllm` answering a
#      completion next to the own engine's (SKIP_VLLM=1 skips it).
#   0. the trainer's pinned environment (trainer/requirements.txt) built exactly as a pod builds it
#      (gpucli/pod/setup_pod.sh + envbuild.py) from a bare Python, cold then warm, timed, and checked
#      to have kernels for this GPU (SKIP_ENV_BUILD=1 skips it); times in OUT/env_build.json;
#   0b. the preflight (trainer/preflight.py): bf16 on one GPU, FP8 where supported, all GPUs (SKIP_PREFLIGHT=1 skips);
# Needs torch with CUDA, pyyaml, typer, rich, requests (no paramiko: the local provider never uses SSH).
#   scripts/gpu_check.sh [OUT_DIR]        # STEPS=300 RESUME_STEPS=50 BENCH_ARGS="--shape 124m" ...
#   SKIP_BENCH=1 PROFILE=cpu STEPS=40 scripts/gpu_check.sh /tmp/x     # the same flow on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-gpu-check}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STEPS=${STEPS:-300}
RESUME_STEPS=${RESUME_STEPS:-50}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
GPUCLI_HOME=$(mktemp -d)
export GPUCLI_HOME
gpucli() { "$PY" -m gpucli.cli.entry "$@"; }

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv || true
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'

# ---- the trainer's pinned environment, built as a pod builds it ------------------------------------------
# The same setup_pod.sh and envbuild.py a launch writes into a pod's run folder, started from a bare Python
# (no packages: what an image with another torch amounts to), so the build is measured: torch from
# PyTorch's index for this driver's CUDA (GPUCLI_TORCH_INDEX / GPUCLI_ENV_INSTALLER override), uv when
# installed. Then again on the same folder (a warm volume), then torch in that venv must know this GPU.
if [ "${SKIP_ENV_BUILD:-0}" != 1 ]; then
    echo "== the trainer's pinned environment (as a pod builds it)"
    envdir=$(mktemp -d)
    cp gpucli/pod/setup_pod.sh gpucli/pod/envbuild.py trainer/requirements.txt "$envdir/"
    "$PY" -m venv --without-pip "$envdir/bare"
    t0=$(date +%s)
    (cd "$envdir" && sh ./setup_pod.sh "$envdir/bare/bin/python" "$envdir/volume") | tee "$OUT/env_cold.log"
    cold_s=$(( $(date +%s) - t0 ))
    t0=$(date +%s)
    (cd "$envdir" && sh ./setup_pod.sh "$envdir/bare/bin/python" "$envdir/volume") | tee "$OUT/env_warm.log"
    warm_s=$(( $(date +%s) - t0 ))
    envpy=$("$PY" -c 'import json, sys; print(json.loads(sys.stdin.read().splitlines()[-1].split(" ", 1)[1])["python"])' \
        < "$OUT/env_warm.log")
    "$envpy" - "$cold_s" "$warm_s" "$OUT/env_build.json" <<'EOF'
import json, sys, torch
cold, warm, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
row = {"cold_s": cold, "warm_s": warm, "torch": torch.__version__, "cuda": torch.version.cuda,
       "arch_list": torch.cuda.get_arch_list() if torch.cuda.is_available() else []}
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability()
    row["gpu"], row["sm"] = torch.cuda.get_device_name(), f"sm_{major}{minor}"
    # a kernel for this GPU: its own sm_XY, or an older one of the same major (binary compatible)
    row["kernels_for_gpu"] = any(a.startswith(f"sm_{major}") and int(a[len(f"sm_{major}"):] or 0) <= minor
                                 for a in row["arch_list"])
    x = torch.randn(256, 256, device="cuda")
    row["matmul_ok"] = bool(torch.isfinite(x @ x).all().item())
json.dump(row, open(out, "w"))
print("pinned environment:", row)
if torch.cuda.is_available() and not (row["kernels_for_gpu"] and row["matmul_ok"]):
    sys.exit(f"the pinned torch has no kernels for {row['sm']} (arch list {row['arch_list']})")
EOF
fi

# ---- the preflight (trainer/preflight.py, gpucli/run/starting/preflight.py) -------------------------------------------
# What `gpucli launch` runs on a rented machine before it detaches the run, here on this machine's GPUs, held
# to the catalogue's peak and its family's bar (gpucli/profiles/health.yaml): bf16 on one GPU, FP8 where the
# GPU and torchao have it, then every GPU of the machine under torchrun (the NCCL all-reduce). Each verdict is
# OUT/preflight_<case>.json; the launch further down runs it again through gpucli (`status` shows it).
if [ "${SKIP_PREFLIGHT:-0}" != 1 ]; then
    echo "== preflight (${PROFILE:-h100}'s run.yaml, grad_accum 4)"
    pf="$OUT/preflight"
    mkdir -p "$pf/run/code"
    gpucli launch --provider local --profile "${PROFILE:-h100}" --phase fast --name pf-yaml --dry-run --json --force \
        | "$PY" -c 'import json, sys, yaml; yaml.safe_dump(json.load(sys.stdin)["run_yaml"], sys.stdout)' > "$pf/run/run.yaml"
    read -r PEAK SHARE NGPU FP8 <<<"$("$PY" -c '
import importlib.util, torch
from gpucli.plan.catalog import load_catalog
from gpucli.plan.parse import match_gpu_name
from gpucli.runs.health import thresholds
cuda = torch.cuda.is_available()
gpu = match_gpu_name(load_catalog().gpus, torch.cuda.get_device_name()) if cuda else None
fp8 = cuda and torch.cuda.get_device_capability() >= (8, 9) and importlib.util.find_spec("torchao") is not None
print(gpu.bf16_dense_tflops if gpu else 0, thresholds(gpu.architecture).min_matmul_share if gpu else 0,
      torch.cuda.device_count(), int(fp8))')"
    echo "peak ${PEAK} TFLOPS, bar ${SHARE}, ${NGPU} GPUs, fp8 ${FP8}"
    held=(); [ "$PEAK" != 0 ] && held=(--peak-tflops "$PEAK" --min-share "$SHARE")
    preflight() {  # CASE NPROC [trainer overrides...]
        local case=$1 n=$2 t0; shift 2
        local head=("$PY" -m trainer.preflight)
        [ "$n" -gt 1 ] && head=("$PY" -m torch.distributed.run --standalone "--nproc_per_node=$n" -m trainer.preflight)
        t0=$(date +%s)
        (cd "$pf/run/code" && "${head[@]}" --config ../run.yaml --out "../$case" --gpus "$n" "${held[@]}" \
            --training.grad_accum_steps=4 --data.max_bytes=20000000 "$@") > "$pf/$case.log" 2>&1 || true
        cp "$pf/run/$case/result_rank0.json" "$OUT/preflight_$case.json" 2>/dev/null \
            || echo '{"ok": false, "error": "no result: see preflight/'"$case"'.log"}' > "$OUT/preflight_$case.json"
        echo "$case ($(( $(date +%s) - t0 )) s): $(cat "$OUT/preflight_$case.json")"
    }
    preflight bf16_1gpu 1
    if [ "$FP8" = 1 ]; then preflight fp8_1gpu 1 --hardware.fp8=true; fi
    if [ "${NGPU:-0}" -gt 1 ]; then preflight bf16_all "$NGPU"; fi
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    echo "== throughput (scripts/bench_trainer.py ${BENCH_ARGS:-})"
    # shellcheck disable=SC2086
    "$PY" scripts/bench_trainer.py ${BENCH_ARGS:-} --json --write-calibration "$OUT/calibration.yaml" \
        | tee "$OUT/bench.jsonl"
fi

echo "== a 124M run on the demo corpus through gpucli"
t0=$(date +%s)
gpucli launch --provider local --profile "${PROFILE:-h100}" --phase fast --name demo --steps "$STEPS" \
    --val-interval 50 --set training.grad_accum_steps=1 --set training.checkpoint_interval=100
run_dir="$GPUCLI_HOME/local-runs/demo"
deadline=$((t0 + ${RUN_DEADLINE_S:-420}))
while :; do
    state=$(gpucli status demo --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    case "$state" in finished|failed|crashed|stopped) break ;; esac
    if [ "$(date +%s)" -gt "$deadline" ]; then echo "run still $state at the deadline"; gpucli down demo; break; fi
    sleep 5
done
echo "state $state after $(( $(date +%s) - t0 )) s"
gpucli status demo
gpucli tail demo --no-follow | tail -40
gpucli fetch-best demo --dest "$GPUCLI_HOME/best"
cp "$run_dir/metrics.jsonl" "$OUT/demo_metrics.jsonl"
cp "$run_dir/train.log" "$OUT/demo_train.log"

echo "== resume from the newest checkpoint for $RESUME_STEPS more steps"
(cd "$run_dir/code" && "$PY" -m trainer.train --config ../run.yaml --resume auto \
    "--training.max_steps=$((STEPS + RESUME_STEPS))") > "$OUT/resume.log" 2>&1 || { tail -30 "$OUT/resume.log"; exit 1; }
grep -iE "resum|finished" "$OUT/resume.log" | head -5 || true
tail -3 "$OUT/resume.log"
cp "$run_dir/metrics.jsonl" "$OUT/demo_metrics.jsonl"
"$PY" - "$OUT/demo_metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
val = [(r["step"], round(r["val_loss"], 4)) for r in rows if r.get("kind") == "val"]
train = [r for r in rows if r.get("kind") == "train"]
events = [(r.get("event"), r.get("step")) for r in rows if r.get("kind") == "event"]
print("val loss by step:", val)
print("last train row:", {k: train[-1].get(k) for k in ("step", "loss", "tok_per_s", "mfu", "mem_gib")} if train else None)
print("events:", events)
EOF

echo "== export to the Hugging Face layout"
gpucli export demo --dest "$OUT/export"
if "$PY" -c 'import transformers' 2>/dev/null; then
    "$PY" - "$OUT/export/demo-hf" <<'EOF'
import sys, time, torch, transformers
t0 = time.perf_counter()
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = transformers.AutoTokenizer.from_pretrained(sys.argv[1])
print(f"transformers loads {type(m).__name__} in {time.perf_counter() - t0:.1f} s")
ids = tok("The ", return_tensors="pt").input_ids
print("greedy:", repr(tok.decode(m.generate(ids, max_new_tokens=30, do_sample=False)[0])))
EOF
fi

if [ "${SKIP_VLLM:-0}" != 1 ] && "$PY" -c 'import vllm' 2>/dev/null; then
    echo "== vLLM on the export (gpucli serve --on-pod --engine vllm) against the own engine"
    for engine in own vllm; do
        gpucli serve demo --on-pod --engine "$engine" > "$OUT/serve_$engine.out" 2> "$OUT/serve_$engine.err" &
        pid=$!
        url=""
        for _ in $(seq 1 180); do url=$(head -1 "$OUT/serve_$engine.out" 2>/dev/null || true); [ -n "$url" ] && break; sleep 5; done
        [ -n "$url" ] || { echo "$engine server did not start"; tail -5 "$OUT/serve_$engine.err"; kill -INT "$pid"; exit 1; }
        curl -s "$url/completions" -H 'Content-Type: application/json' \
            -d '{"model": "demo", "prompt": "The ", "max_tokens": 30, "temperature": 0}' | tee "$OUT/completion_$engine.json"
        echo
        kill -INT "$pid"; wait "$pid" || true
    done
fi
