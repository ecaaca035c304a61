#!/bin/bash
# moetune trial job body, template "venv": site modules and a Python virtual environment.
# `bash job.sh` launches every rank; `bash job.sh rank` is one rank (what srun runs).
set -uo pipefail
FOLDER=/tmp/moetune-tune/runs/mixtral_8x7b_pp4_mbs2_attn-1gpu/9
# One rank: rendezvous from the launcher's environment, then the training command, under
# `nsys profile` on the ranks asked for (one report per rank, named by its rank).
run_rank() {
  local rank=${RANK:-0}  # a fit: the rank it stands for, set by the launch below
  # where the training may leave per-rank files (the CPU stand-in's rank_<RANK>.json)
  export MOETUNE_TRIAL_DIR="$FOLDER"
  local train=(
    /opt/torch/.venv/bin/python3
    -u
    /tmp/moetune-code/pipeline/job/train_moe.py
    --num-layers
    32
    --hidden-size
    4096
    --num-attention-heads
    32
    --ffn-hidden-size
    14336
    --seq-length
    4096
    --max-position-embeddings
    4096
    --vocab-size
    32000
    --num-experts
    8
    --moe-router-topk
    2
    --moe-ffn-hidden-size
    14336
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
    8
    --untie-embeddings-and-output-weights
    --tensor-model-parallel-size
    1
    --pipeline-model-parallel-size
    4
    --expert-model-parallel-size
    8
    --expert-tensor-parallel-size
    1
    --micro-batch-size
    2
    --global-batch-size
    64
    --moe-token-dispatcher-type
    alltoall
    --use-distributed-optimizer
    --recompute-granularity
    selective
    --recompute-modules
    core_attn
    --moe-grouped-gemm
    --moe-expert-capacity-factor
    1.0
    --moe-pad-expert-input-to-capacity
    --transformer-impl
    transformer_engine
    --train-iters
    16
    --profile-step-start
    15
    --profile-step-end
    16
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
  local profile=(/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=node --capture-range=cudaProfilerApi --capture-range-end=stop     -o '/tmp/moetune-tune/runs/mixtral_8x7b_pp4_mbs2_attn-1gpu/9/trace_%q{RANK}' --force-overwrite=true)
  case " $profile_ranks " in
    *" $rank "*)
      # nsys 2022.4 now and then fails to reach its own daemon as it starts ("Local Endpoint is
      # not available") or loses it ("Connection to the Agent lost", once with exit status 0 and
      # the program never run): where it left no report, start it once more
      local err rc
      err=$(mktemp)
      "${profile[@]}" "${train[@]}" 2> >(tee "$err" >&2)
      rc=$?
      if grep -q -E "Local Endpoint is not available|Connection to the Agent lost" "$err" &&
          ! ls "$FOLDER/trace_$rank".nsys-rep "$FOLDER/trace_$rank".qdstrm > /dev/null 2>&1; then
        rm -f "$err"
        echo "moetune: nsys lost its daemon and wrote no report; once more" >&2
        sleep 2
        exec "${profile[@]}" "${train[@]}"
      fi
      rm -f "$err"
      return "$rc" ;;
  esac
  exec "${train[@]}"
}
if [ "${1:-}" = rank ]; then run_rank; exit $?; fi

# environment the trial's config needs (pipeline/spec/environment.py ENV_RULES) and the cluster's own
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
cd /tmp/moetune-code || exit 1
# a fit (each rank that bounds the layout's memory) or a one-GPU trial (rank 0): the ranks one
# after another, alone on this GPU under Megatron's fake process group (WORLD_SIZE and RANK of the
# full job; pipeline/spec/fit.py). tee: the job's log shows iterations as they come (the hang watch)
export WORLD_SIZE=64 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + $$ % 20000))
rc=0
for r in 0 ; do
  echo "moetune fit: rank $r of $WORLD_SIZE"
  RANK=$r bash "$FOLDER/job.sh" rank 2>&1 | tee "$FOLDER/log_rank_$r.txt" || rc=$?
done
exit "$rc"
