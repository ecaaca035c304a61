"""The training job's entry point: a thin Megatron-Core MoE pretrain on mock data.

Runs inside the job (Python 3.12, torch, megatron-core 0.19): `torchrun ... pipeline/job/train_moe.py
<Megatron args>`. It prints Megatron's usual iteration lines, wraps every iteration in an NVTX
range `iteration N`, and opens the profiler's capture range (cudaProfilerStart/Stop) around
iterations --profile-step-start..--profile-step-end (inclusive, numbered as the log numbers
them), so `nsys profile
--capture-range=cudaProfilerApi` records only the steady steps. Megatron's own `--profile` is not
used: it turns on per-op autograd NVTX ranges, which make traces large.
"""
from __future__ import annotations

import os
import sys
from functools import partial


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
        return True
    except Exception:
        return False


def _ensure_dataset_makefile() -> None:
    """The wheel ships the compiled dataset helpers but no Makefile, and Megatron runs `make` in
    that folder on rank 0; give it a Makefile whose default target does nothing."""
    import megatron.core.datasets as ds
    mk = os.path.join(os.path.dirname(ds.__file__), "Makefile")
    if not os.path.exists(mk):
        try:
            with open(mk, "w") as f:
                f.write("all:\n\t@true\n")
        except OSError:
            pass


def main() -> None:
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset
    from megatron.core.enums import ModelType
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer
    from megatron.training import get_args, print_rank_0
    from megatron.training import training as mtraining
    from megatron.training.argument_utils import gpt_config_from_args, pretrain_cfg_container_from_args
    from megatron.training.arguments import parse_and_validate_args

    _ensure_dataset_makefile()
    args = parse_and_validate_args(args_defaults={"tokenizer_type": "NullTokenizer"})
    if args.transformer_impl == "local" or not _te_available():
        print_rank_0("moetune: Transformer Engine absent or not asked for: local layer spec "
                     f"(--transformer-impl {args.transformer_impl})")
    start, stop = args.profile_step_start, args.profile_step_end
    inner = mtraining.train_step

    def profiled_train_step(*a, **kw):
        it = kw.get("iteration")
        it = (mtraining.get_args().curr_iteration if it is None else it) + 1  # as the log counts
        if it == start:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        torch.cuda.nvtx.range_push(f"iteration {it}")
        try:
            out = inner(*a, **kw)
            torch.cuda.synchronize()
        finally:
            torch.cuda.nvtx.range_pop()
        if it == stop:
            torch.cuda.cudart().cudaProfilerStop()
        return out

    mtraining.train_step = profiled_train_step

    def datasets(num_samples, vp_stage=None):
        a = get_args()
        config = GPTDatasetConfig(random_seed=a.seed, sequence_length=a.seq_length, blend=None,
                                  blend_per_split=None, split=a.split, path_to_cache=None,
                                  tokenizer=build_tokenizer(a), reset_position_ids=False,
                                  reset_attention_mask=False, eod_mask_loss=False,
                                  mid_level_dataset_surplus=0.005)
        # every rank builds the same mock data (same seed), so no TP broadcast is needed
        return BlendedMegatronDatasetBuilder(MockGPTDataset, num_samples, lambda: True, config).build()

    datasets.is_distributed = True

    def loss_func(loss_mask, output_tensor, model=None):
        losses = output_tensor.view(-1).float()
        mask = loss_mask.view(-1).float()
        loss = torch.sum(losses * mask)
        n = mask.sum().clone().detach().to(torch.int)
        return loss, n, {"lm loss": torch.cat([loss.clone().detach().view(1), n.view(1)])}

    def forward_step(data_iterator, model, return_schedule_plan: bool = False):
        batch = next(data_iterator)
        tokens = batch["tokens"].cuda(non_blocking=True)
        labels = batch["labels"].cuda(non_blocking=True)
        loss_mask = batch["loss_mask"].cuda(non_blocking=True)
        position_ids = batch["position_ids"].cuda(non_blocking=True)
        if return_schedule_plan:  # EP all-to-all overlap asks for the schedule plan
            plan = model.build_schedule_plan(tokens, position_ids, None, labels=labels,
                                             loss_mask=loss_mask)
            return plan, partial(loss_func, loss_mask, model=model)
        out = model(tokens, position_ids, None, labels=labels, loss_mask=loss_mask)
        return out, partial(loss_func, loss_mask, model=model)

    model_cfg = gpt_config_from_args(args)
    full = pretrain_cfg_container_from_args(args, model_cfg)
    mtraining.pretrain(full, datasets, ModelType.encoder_or_decoder, forward_step)
    if getattr(args, "fake_process_group", False) or int(os.environ.get("RANK", "0")) == 0:
        report_peak(args.train_iters)


def report_peak(iterations: int) -> None:
    """The whole run's peak in the form of Megatron's memory report. Megatron reports memory only
    after the first iterations, before CUDA graphs are captured (after --cuda-graph-warmup-steps):
    a fit of a graphed layout needs the peak with the graphs' private pools in it."""
    import torch
    mb = 1024 * 1024
    print(f"[Rank {os.environ.get('RANK', '0')}] (after {iterations} iterations) memory (MB) | "
          f"allocated: {torch.cuda.memory_allocated() / mb:.2f} | "
          f"max allocated: {torch.cuda.max_memory_allocated() / mb:.2f} | "
          f"reserved: {torch.cuda.memory_reserved() / mb:.2f} | "
          f"max reserved: {torch.cuda.max_memory_reserved() / mb:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
