#!/usr/bin/env bash
# Calibration run on real GPUs with torchrun: one process per GPU, NCCL.
# Run the same command on every node (NODE_RANK=0..NNODES-1), or use calibrate.sbatch.
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node-a ./torchrun_calibration.sh   # on node-a
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node-a ./torchrun_calibration.sh   # on node-b
#
# Everything lands in $OUT (a shared file system); each finished measurement is on disk
# before the next starts, so rerunning the same command after a failure resumes.
set -euo pipefail

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
CLUSTER=${CLUSTER:-dgx-h100}          # the preset these machines are (trainsim hardware list)
OUT=${OUT:-calibration-$(date +%Y%m%d)}
WORLD=$((NNODES * GPUS_PER_NODE))

run() {  # torchrun starts one `trainsim ...` per GPU; trainsim reads RANK/WORLD_SIZE itself
  torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --no-python trainsim "$@"
}

# 1. collectives over every GPU, nccl-tests columns (also readable by trainsim calibrate)
run validate collectives --backend nccl --nodes "$NNODES" --min-bytes 8 --max-bytes 4G \
  --out "$OUT/collectives"
# 2. GEMM shape sweep and HBM copy bandwidth on every GPU
run validate gemm --backend nccl --dtype bf16 --sizes 256,512,1024,2048,4096,8192 \
  --copy-sizes 16M,256M,1G --out "$OUT/compute"
# 3. a real training step: the Program the simulator replays, every op timed
run validate replay --backend nccl --model llama3-8b --gpus "$WORLD" --tp "$GPUS_PER_NODE" \
  --pp "$NNODES" --seq-len 4096 --global-batch $((4 * NNODES)) --iterations 5 --warmup 2 \
  --out "$OUT/replay"

if [ "$NODE_RANK" = 0 ]; then
  # 4. fit, then check the simulator against the replay it did not see as a whole
  trainsim calibrate "$OUT/collectives" "$OUT/compute" "$OUT/replay" --cluster "$CLUSTER" \
    --out "$OUT/calibration.toml"
  trainsim validate compare "$OUT/replay" --cluster "$CLUSTER" \
    --calibration "$OUT/calibration.toml" --tolerance 0.15
fi
