#!/usr/bin/env bash
# The learner and the sampler at Qwen2.5-Coder sizes (random weights, bf16 compute) on one
# accelerator: what results/performance.md quotes for a GPU.
#
#   bash experiments/gpu_bench.sh [LOG_DIR]     # PYTHON=... to choose the interpreter
#
# Each figure is experiments/bench.py's median of 3 timed runs after a compiling one. The
# Qwen presets run their layers as a lax.scan (compile time flat in depth), so both sizes
# compile within the device's 10-minute command limit; each run has its own time limit
# (RUN_LIMIT_S, default 270 s) so that one slow size cannot starve the other.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
LOG_DIR="${1:-/tmp/gpu_bench}"
RUN_LIMIT_S="${RUN_LIMIT_S:-270}"
mkdir -p "$LOG_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
"$PYTHON" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, \
'optax', optax.__version__, jax.devices())"

status=0
run() {  # run NAME ARGS...: one bench.py invocation, its output kept in LOG_DIR/NAME.log
  local name="$1"
  shift
  echo "== $name: bench.py $*"
  local t0=$SECONDS
  timeout "$RUN_LIMIT_S" "$PYTHON" experiments/bench.py "$@" 2>&1 | grep -v -e "^I[0-9]" -e "^W[0-9]" | tee "$LOG_DIR/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc, $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || status=1
}

# Qwen2.5-Coder-0.5B: sampler (64 rows, 256-token prompts, 256 new), forward+backward,
# and the full GRPO/GAGAR learner step (4 groups x 8, 512 tokens; AdamW on fp32 weights).
run qwen05b --size=qwen2.5-coder-0.5b --dtype=bfloat16 \
  --sections=sampler,model,learner,kernel --skip_naive \
  --batch=64 --prompt_len=256 --gen_len=256 --train_batch=16 --train_len=512 \
  --matmul_n=8192 --learner_sizes=small,qwen2.5-coder-0.5b --groups=4 --group_size=8 \
  --kernel_b=65536 --repeats=3
# Qwen2.5-Coder-1.5B: sampler and learner step at the same shapes.
run qwen15b --size=qwen2.5-coder-1.5b --dtype=bfloat16 --sections=sampler,learner \
  --skip_naive --batch=64 --prompt_len=256 --gen_len=256 --train_len=512 \
  --matmul_n=8192 --learner_sizes=qwen2.5-coder-1.5b --groups=4 --group_size=8 --repeats=3
exit $status
