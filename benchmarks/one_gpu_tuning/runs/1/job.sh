#!/bin/bash
# moetune trial job body, template "venv": site modules and a Python virtual environment.
# `bash job.sh` launches every rank; `bash job.sh rank` is one rank (what srun runs).
set -uo pipefail
FOLDER=/tmp/moetune-tune/runs/qwen3_30b_a3b-1gpu/1
# One rank: rendezvous from the launcher's environment, then the training command, under
# `nsys profile` on the ranks asked for (one report per rank, named by its rank).
run_rank() {
  local rank=${RANK:-0}  # a fit: the rank it stands for, set by the launch below
  # where the training may leave per-rank files (the CPU stand-in's rank_<RANK>.json)
  export MOETUNE_TRIAL_DIR="$FOLDER"
  local train=(
    /opt/torch/.venv/bin/python3
    -u
    /tmp/moetune-code/moetune/workloads/train_moe.py
    --num-layers
    48
    --hidden-size
    2048
    --num-attention-heads
    32
    --ffn-hidden-size
    6144
    --seq-length
    4096
    --max-position-embeddings
    4096
    --vocab-size
    151936
    --num-experts
    128
    --moe-router-topk
    8
    --moe-ffn-hidden-size
    768
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
    16
    --expert-tensor-parallel-size
    1
    --micro-batch-size
    1
    --global-batch-size
    64
    --moe-token-dispatcher-type
    alltoall
    --use-distributed-optimizer
    --moe-grouped-gemm
    --moe-router-dtype
    fp32
    --moe-expert-capacity-factor
    1.0
    --moe-pad-expert-input-to-capacity
    --transformer-impl
    transformer_engine
    --train-iters
    12
    --profile-step-start
    11
    --profile-step-end
    12
    --bf16
    --no-gradient-accumulation-fusion
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
    --fake-process-group
  )
  local profile_ranks=0
  local profile=(/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys profile -t cuda,nvtx -s none --cpuctxsw=none --capture-range=cudaProfilerApi --capture-range-end=stop     -o '/tmp/moetune-tune/runs/qwen3_30b_a3b-1gpu/1/trace_%q{RANK}' --force-overwrite=true)
  case " $profile_ranks " in
    *" $rank "*)
      # nsys 2022.4 now and then fails to reach its own daemon as it starts ("Local Endpoint is
      # not available"), before the program runs: then start it once more
      local err rc
      err=$(mktemp)
      "${profile[@]}" "${train[@]}" 2> >(tee "$err" >&2)
      rc=$?
      if [ "$rc" != 0 ] && grep -q "Local Endpoint is not available" "$err"; then
        rm -f "$err"
        echo "moetune: nsys could not start (Local Endpoint is not available); once more" >&2
        sleep 2
        exec "${profile[@]}" "${train[@]}"
      fi
      rm -f "$err"
      return "$rc" ;;
  esac
  exec "${train[@]}"
}
if [ "${1:-}" = rank ]; then run_rank; exit $?; fi

# environment the trial's config needs (moetune/experiment/environment.py ENV_RULES) and the cluster's own
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cd /tmp/moetune-code || exit 1
# a fit (each rank that bounds the layout's memory) or a one-GPU trial (rank 0): the ranks one
# after another, alone on this GPU under Megatron's fake process group (WORLD_SIZE and RANK of the
# full job; moetune/experiment/fit.py). tee: the job's log shows iterations as they come (the hang watch)
export WORLD_SIZE=16 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + $$ % 20000))
rc=0
for r in 0 ; do
  echo "moetune fit: rank $r of $WORLD_SIZE"
  RANK=$r bash "$FOLDER/job.sh" rank 2>&1 | tee "$FOLDER/log_rank_$r.txt" || rc=$?
done
exit "$rc"
