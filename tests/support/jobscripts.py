"""Small third-party-style training scripts, one per console format gpucli reads (written by the tests
into a code folder and run through ``gpucli/pod/jobrun.py``). Each prints its project's log lines
exactly as that project formats them and writes checkpoints the way that project does; none knows
about gpucli beyond reading ``$GPUCLI_CHECKPOINTS`` (and ``$GPUCLI_METRICS`` for the JSON one)."""

from __future__ import annotations

import textwrap
from pathlib import Path

# A character bigram model trained by gradient descent on local text, printing nanoGPT's train.py lines:
# "step {iter}: train loss {:.4f}, val loss {:.4f}" at each eval, "iter {iter}: loss {:.4f}, time {:.2f}ms,
# mfu {:.2f}%" (running MFU starts at -1, so "-100.00%" until it is measured), and ckpt.pt overwritten
# whenever the val loss improves (nanoGPT's always_save_checkpoint=False). Standard library only.
NANOGPT_STYLE = '''
import json, math, os, random, sys, time

text = open(sys.argv[1] if len(sys.argv) > 1 else "input.txt").read()
chars = sorted(set(text)); stoi = {c: i for i, c in enumerate(chars)}; V = len(chars)
data = [stoi[c] for c in text]; n = int(0.9 * len(data)); train_data, val_data = data[:n], data[n:]
out_dir = os.environ.get("GPUCLI_CHECKPOINTS", "out")
os.makedirs(out_dir, exist_ok=True)
max_iters, eval_interval, log_interval, lr = int(os.environ.get("MAX_ITERS", "60")), 20, 1, 1.0
random.seed(1337)
W = [[0.0] * V for _ in range(V)]

def loss_on(split, k=200):
    d = train_data if split == "train" else val_data
    total = 0.0
    for _ in range(k):
        i = random.randrange(len(d) - 1)
        row = W[d[i]]; m = max(row); z = sum(math.exp(x - m) for x in row)
        total += -(row[d[i + 1]] - m - math.log(z))
    return total / k

best_val_loss, running_mfu, t0 = 1e9, -1.0, time.time()
for iter_num in range(max_iters + 1):
    if iter_num % eval_interval == 0:
        tr, va = loss_on("train"), loss_on("val")
        print(f"step {iter_num}: train loss {tr:.4f}, val loss {va:.4f}")
        if va < best_val_loss:
            best_val_loss = va
            if iter_num > 0:
                print(f"saving checkpoint to {out_dir}")
                json.dump({"model": W, "iter_num": iter_num, "best_val_loss": va}, open(os.path.join(out_dir, "ckpt.pt"), "w"))
    if iter_num == max_iters:
        break
    batch = [random.randrange(len(train_data) - 1) for _ in range(32)]
    grads, loss = {}, 0.0
    for i in batch:
        a, b = train_data[i], train_data[i + 1]
        row = W[a]; m = max(row); ex = [math.exp(x - m) for x in row]; z = sum(ex)
        loss += -(row[b] - m - math.log(z)) / len(batch)
        g = grads.setdefault(a, [0.0] * V)
        for j in range(V):
            g[j] += (ex[j] / z - (1.0 if j == b else 0.0)) / len(batch)
    for a, g in grads.items():
        for j in range(V):
            W[a][j] -= lr * g[j] * V
    t1 = time.time(); dt = t1 - t0; t0 = t1
    if iter_num % log_interval == 0:
        if iter_num >= 5:
            running_mfu = 0.0123 if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * 0.0123
        print(f"iter {iter_num}: loss {loss:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")
'''

# nanochat scripts/base_train.py's lines, a checkpoint every 5 steps as its checkpoint_manager names them
# (model_{step:06d}.pt, meta_{step:06d}.json, optim_{step:06d}_rank{rank}.pt). The validation bpb is lowest
# at step 10, so fetch-best must choose step 10 although 20 is newer.
NANOCHAT_STYLE = '''
import json, os, time
ck = os.environ["GPUCLI_CHECKPOINTS"]
num_iterations = 20
vals = {5: 1.10, 10: 0.80, 15: 0.90, 20: 0.95}
for step in range(num_iterations + 1):
    if step in vals:
        print(f"Step {step:05d} | Validation bpb: {vals[step]:.6f}")
        with open(os.path.join(ck, f"model_{step:06d}.pt"), "wb") as f:
            f.write(b"weights" * 10)
        with open(os.path.join(ck, f"optim_{step:06d}_rank0.pt"), "wb") as f:
            f.write(b"optim")
        json.dump({"step": step, "val_bpb": vals[step]}, open(os.path.join(ck, f"meta_{step:06d}.json"), "w"))
    if step == num_iterations:
        break
    loss = 4.0 - step * 0.1
    print(f"step {step:05d}/{num_iterations:05d} ({100 * step / num_iterations:.2f}%) | loss: {loss:.6f} | lrm: 1.00 | "
          f"dt: 12.34ms | tok/sec: {524288:,} | mfu: 41.50 | epoch: 0 | total time: 0.00m")
    time.sleep(0.01)
'''

# Hugging Face Trainer: a tqdm training bar on stderr with carriage-return updates (its count is
# global_step), str(logs) written above it every logging_steps=10, an eval every 20 steps, and
# checkpoint-N/ folders as save_steps=20 writes them.
HF_STYLE = '''
import json, os, sys, time
ck = os.environ["GPUCLI_CHECKPOINTS"]
max_steps = 40
def bar(n):
    pct = int(100 * n / max_steps)
    sys.stderr.write(f"\\r{pct:3d}%|{'#' * (pct // 10):10s}| {n}/{max_steps} [00:01<00:02, 20.00it/s]")
    sys.stderr.flush()
bar(0)
for step in range(1, max_steps + 1):
    bar(step)
    if step % 10 == 0:
        sys.stderr.write("\\n"); sys.stderr.flush()
        print(str({"loss": round(3.0 - step * 0.05, 4), "grad_norm": 1.25, "learning_rate": 5e-05 * (1 - step / max_steps),
                   "epoch": round(step / 20, 2)}), flush=True)
        bar(step)  # tqdm.write redraws the bar after the line
    if step % 20 == 0:
        for k in range(3):  # the evaluation bar: another total, never the step
            sys.stderr.write(f"\\r{33 * (k + 1)}%|###| {k + 1}/3 [00:00<00:00, 30.00it/s]")
        sys.stderr.write("\\n"); sys.stderr.flush()
        print(str({"eval_loss": {20: 1.9, 40: 2.1}[step], "eval_runtime": 0.1, "eval_samples_per_second": 30.0,
                   "epoch": round(step / 20, 2)}), flush=True)
        bar(step)
        d = os.path.join(ck, f"checkpoint-{step}")
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "model.safetensors"), "wb").write(b"w" * step)
        json.dump({"global_step": step}, open(os.path.join(d, "trainer_state.json"), "w"))
    time.sleep(0.005)
sys.stderr.write("\\n")
print(str({"train_runtime": 1.5, "train_samples_per_second": 100.0, "train_loss": 2.5, "epoch": 2.0}))
'''

# PyTorch Lightning's TQDMProgressBar: "Epoch {e}: pct%|bar| n/total [..., v_num=0, train_loss=x]" with \\r
# updates, a "Validation DataLoader 0" bar, val_loss in the postfix after validation, and
# ModelCheckpoint files "epoch={e}-step={global_step}.ckpt".
LIGHTNING_STYLE = '''
import os, sys, time
ck = os.environ["GPUCLI_CHECKPOINTS"]
total = 10
val_loss = None
for epoch in range(2):
    for n in range(1, total + 1):
        loss = 2.0 - 0.05 * (epoch * total + n)
        post = f"v_num=0, train_loss={loss:.3f}" + (f", val_loss={val_loss:.3f}" if val_loss is not None else "")
        sys.stdout.write(f"\\rEpoch {epoch}: {10 * n:3d}%|{'#' * n:10s}| {n}/{total} [00:00<00:00, 50.00it/s, {post}]")
        sys.stdout.flush()
        time.sleep(0.005)
    for k in range(1, 3):
        sys.stdout.write(f"\\rValidation DataLoader 0: {50 * k}%|#####| {k}/2 [00:00<00:00, 80.00it/s]")
    val_loss = [1.5, 1.2][epoch]
    post = f"v_num=0, train_loss={loss:.3f}, val_loss={val_loss:.3f}"
    sys.stdout.write(f"\\rEpoch {epoch}: 100%|##########| {total}/{total} [00:00<00:00, 50.00it/s, {post}]\\n")
    open(os.path.join(ck, f"epoch={epoch}-step={(epoch + 1) * total}.ckpt"), "wb").write(b"x")
'''

# A script that logs its own rows to $GPUCLI_METRICS (and nothing parseable to the console).
JSON_FILE_STYLE = '''
import json, os, time
with open(os.environ["GPUCLI_METRICS"], "a") as f:
    for step in range(1, 6):
        f.write(json.dumps({"step": step, "loss": 2.0 / step, "tok_per_s": 1000.0}) + "\\n"); f.flush()
        print(f"working on step {step}", flush=True)
        time.sleep(0.05)
    f.write(json.dumps({"step": 5, "val_loss": 0.7}) + "\\n")
'''

# Stops cleanly on SIGTERM after writing an emergency checkpoint (what a budget cap expects of a job).
GRACEFUL = '''
import os, signal, sys, time
ck = os.environ["GPUCLI_CHECKPOINTS"]
open(os.path.join(os.environ["GPUCLI_RUN_DIR"], "job.pid"), "w").write(str(os.getpid()))
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
step = 0
while not stop:
    step += 1
    print(f"iter {step}: loss {1.0 + 1.0 / step:.4f}, time 10.00ms, mfu -100.00%", flush=True)
    time.sleep(0.05)
time.sleep(0.5)  # the checkpoint takes a moment
open(os.path.join(ck, f"emergency_step_{step}.pt"), "w").write("ok")
print("saved emergency checkpoint", flush=True)
'''

# Ignores SIGTERM: only SIGKILL after the grace period ends it.
STUBBORN = '''
import os, signal, time
open(os.path.join(os.environ["GPUCLI_RUN_DIR"], "job.pid"), "w").write(str(os.getpid()))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("iter 1: loss 2.0000, time 1.00ms, mfu -100.00%", flush=True)
while True:
    time.sleep(0.1)
'''

FAILING = '''
import sys
print("iter 0: loss 5.0000, time 1.00ms, mfu -100.00%", flush=True)
print("loading shard 7", flush=True)
raise RuntimeError("CUDA out of memory (pretend)")
'''

SCRIPTS = {"nanogpt": NANOGPT_STYLE, "nanochat": NANOCHAT_STYLE, "hf": HF_STYLE, "lightning": LIGHTNING_STYLE,
           "jsonfile": JSON_FILE_STYLE, "graceful": GRACEFUL, "stubborn": STUBBORN, "failing": FAILING}


def write_script(code_dir: Path, kind: str) -> str:
    """Write the ``kind`` script into ``code_dir`` and return its file name."""
    code_dir.mkdir(parents=True, exist_ok=True)
    name = f"train_{kind}.py"
    (code_dir / name).write_text(textwrap.dedent(SCRIPTS[kind]).lstrip())
    return name


def local_text() -> str:
    """A few hundred lines of local text to train on (no download)."""
    lines = []
    for i in range(300):
        lines.append(f"the quick brown fox {i % 7} jumps over the lazy dog and the cat sat on the mat number {i % 11}.")
    return "\n".join(lines) + "\n"
