#!/bin/bash
# moetune trial job body, template "venv": site modules and a Python virtual environment.
# `bash job.sh` launches every rank; `bash job.sh rank` is one rank (what srun runs).
set -uo pipefail
FOLDER=/tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5
# A profiled rank's report exported to SQLite here, by the nsys that recorded it (an older nsys
# cannot open a newer report), with that nsys's version beside it for the post-processing to check.
# A failed export loses nothing: the report stays, and the post-processing says why it cannot.
export_rank() {
  local report=/tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/trace_"$1".nsys-rep
  /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys --version > /tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/trace_"$1".nsys-version 2>&1 || true
  if [ -f "$report" ]; then
    /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys export --type sqlite --force-overwrite true \
      -o /tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/trace_"$1".sqlite "$report" \
      > /dev/null || echo "moetune: nsys export of ${report##*/} failed in the job" >&2
  fi
}
# One rank: rendezvous from the launcher's environment, then the training command, under
# `nsys profile` on the ranks asked for (one report per rank, named by its rank).
run_rank() {
  local rank=${RANK:-0}  # a fit: the rank it stands for, set by the launch below
  # where the training may leave per-rank files (the CPU stand-in's rank_<RANK>.json)
  export MOETUNE_TRIAL_DIR="$FOLDER"
  # the image's Megatron-LM source tree before any megatron-core installed beside it
  export PYTHONPATH=/opt/Megatron-Bridge/3rdparty/Megatron-LM${PYTHONPATH:+:$PYTHONPATH}
  local train=(
    /opt/torch/.venv/bin/python3
    -u
    /tmp/moetune-code/moetune/workloads/train_moe.py
    --num-layers
    56
    --hidden-size
    6144
    --num-attention-heads
    48
    --ffn-hidden-size
    16384
    --seq-length
    4096
    --max-position-embeddings
    4096
    --vocab-size
    32768
    --num-experts
    8
    --moe-router-topk
    2
    --moe-ffn-hidden-size
    16384
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
    2
    --pipeline-model-parallel-size
    8
    --expert-model-parallel-size
    8
    --expert-tensor-parallel-size
    1
    --sequence-parallel
    --micro-batch-size
    1
    --global-batch-size
    128
    --moe-token-dispatcher-type
    alltoall
    --use-distributed-optimizer
    --cuda-graph-impl
    transformer_engine
    --cuda-graph-modules
    attn
    moe_router
    moe_preprocess
    --moe-grouped-gemm
    --moe-permute-fusion
    --moe-router-fusion
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
  # each rank on the CPUs of its GPU's share of the node's NUMA nodes (8 GPUs on 2 sockets: local
  # ranks 0-3 on node 0, 4-7 on node 1), as NVIDIA's launchers bind them
  local numa
  numa=$(ls -d /sys/devices/system/node/node[0-9]* 2> /dev/null | wc -l)
  if [ "$numa" -gt 1 ]; then
    if command -v numactl > /dev/null; then
      train=(numactl --cpunodebind=$(( ${LOCAL_RANK:-0} * numa / 1 )) "${train[@]}")
    else
      echo "moetune: numactl is not in the image; rank $rank is not bound to a NUMA node" >&2
    fi
  fi
  local profile_ranks=112
  local profile=(/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys profile -t cuda,nvtx -s none --cpuctxsw=none --cuda-graph-trace=node --capture-range=cudaProfilerApi --capture-range-end=stop     -o '/tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/trace_%q{RANK}' --force-overwrite=true)
  case " $profile_ranks " in
    *" $rank "*)
      # nsys 2022.4 now and then fails to reach its own daemon as it starts ("Local Endpoint is
      # not available") or loses it ("Connection to the Agent lost", once with exit status 0 and
      # the program never run): where it left no report, start it once more
      local err rc tries=0 ended="moetune: nsys ended with status"
      err=$(mktemp)
      # the check may read $err only once tee has copied all nsys wrote: a line written after it
      # exits, into the same pipe, says so (tee's own end may wait on nsys's lingering agent)
      { "${profile[@]}" "${train[@]}"; rc=$?; echo "$ended $rc" >&2; } 2> >(tee "$err" >&2)
      until grep -q "^$ended" "$err" || (( ++tries > 600 )); do sleep 0.1; done
      if grep -q -E "Local Endpoint is not available|Connection to the Agent lost" "$err" &&
          ! ls /tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/trace_"$rank".nsys-rep \
            /tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/trace_"$rank".qdstrm > /dev/null 2>&1; then
        rm -f "$err"
        echo "moetune: nsys lost its daemon and wrote no report; once more" >&2
        sleep 2
        "${profile[@]}" "${train[@]}"
        rc=$?
      fi
      rm -f "$err"
      export_rank "$rank"
      return "$rc" ;;
  esac
  exec "${train[@]}"
}
if [ "${1:-}" = rank ]; then run_rank; exit $?; fi

# environment the trial's config needs (moetune/experiment/environment.py ENV_RULES) and the cluster's own
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_GRAPH_REGISTER=0
export NCCL_NVLS_ENABLE=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export TORCH_NCCL_HIGH_PRIORITY=1
cd /tmp/moetune-code || exit 1
# a fit (each rank that bounds the layout's memory) or a one-GPU trial (rank 0): the ranks one
# after another, alone on this GPU under Megatron's fake process group (WORLD_SIZE and RANK of the
# full job; moetune/experiment/fit.py). tee: the job's log shows iterations as they come (the hang watch)
export WORLD_SIZE=128 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + $$ % 20000))
rc=0
for r in 112 ; do
  echo "moetune fit: rank $r of $WORLD_SIZE"
  RANK=$r bash /tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/job.sh rank 2>&1 | tee /tmp/moetune-tune/runs/mixtral_8x22b-1gpu/5/log_rank_"$r".txt || rc=$?
done
exit "$rc"
