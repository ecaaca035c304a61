#!/bin/bash
# moetune trial job body, template "venv": site modules and a Python virtual environment.
# `bash job.sh` launches every rank; `bash job.sh rank` is one rank (what srun runs).
set -uo pipefail
FOLDER=/tmp/moetune-tune/runs/moe_proxy/6
# One rank: rendezvous from the launcher's environment, then the training command, under
# `nsys profile` on the ranks asked for (one report per rank, named by its rank).
run_rank() {
  local rank=${RANK:-0}
  local train=(
    /opt/torch/.venv/bin/python3
    -u
    -m
    pipeline.train_moe
    --num-layers
    4
    --hidden-size
    2048
    --num-attention-heads
    16
    --ffn-hidden-size
    6144
    --seq-length
    2048
    --max-position-embeddings
    2048
    --vocab-size
    32768
    --num-experts
    16
    --moe-router-topk
    4
    --moe-ffn-hidden-size
    1536
    --normalization
    RMSNorm
    --swiglu
    --disable-bias-linear
    --position-embedding-type
    rope
    --rotary-base
    1000000
    --moe-router-score-function
    softmax
    --group-query-attention
    --num-query-groups
    4
    --kv-channels
    128
    --qk-layernorm
    --untie-embeddings-and-output-weights
    --tensor-model-parallel-size
    1
    --pipeline-model-parallel-size
    1
    --expert-model-parallel-size
    2
    --micro-batch-size
    8
    --global-batch-size
    16
    --moe-token-dispatcher-type
    alltoall
    --overlap-moe-expert-parallel-comm
    --transformer-impl
    local
    --train-iters
    16
    --profile-step-start
    10
    --profile-step-end
    13
    --bf16
    --no-rope-fusion
    --no-persist-layer-norm
    --no-gradient-accumulation-fusion
    --no-masked-softmax-fusion
    --mock-data
    --tokenizer-type
    NullTokenizer
    --lr
    1e-4
    --min-lr
    1e-5
    --lr-decay-style
    cosine
    --weight-decay
    0.1
    --clip-grad
    1.0
    --init-method-std
    0.008
    --log-interval
    1
    --log-throughput
    --eval-iters
    0
    --eval-interval
    1000000
    --split
    100,0,0
  )
  local profile_ranks='0 1'
  case " $profile_ranks " in
    *" $rank "*)
      exec /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop \
        -o '/tmp/moetune-tune/runs/moe_proxy/6/trace_%q{RANK}' --force-overwrite=true "${train[@]}" ;;
  esac
  exec "${train[@]}"
}
if [ "${1:-}" = rank ]; then run_rank; exit $?; fi

# environment the trial's config needs (moetune/render.py ENV_RULES) and the cluster's own
export CUDA_DEVICE_MAX_CONNECTIONS=32
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cd /work/main || exit 1
# no Slurm: one local process per rank
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + $$ % 20000)) WORLD_SIZE=2
pids=()
for ((r = 0; r < 2; r++)); do
  RANK=$r LOCAL_RANK=$r bash "$FOLDER/job.sh" rank &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit "$rc"
