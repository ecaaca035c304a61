"""The training job's entry point: a thin Megatron-Core MoE pretrain on mock data.

Runs inside the job (Python 3.12, torch, the image's Megatron): `torchrun ...
moetune/workloads/train_moe.py <Megatron args>`. It prints Megatron's usual iteration lines, wraps every
iteration in an NVTX range `iteration N`, and opens the profiler's capture range
(cudaProfilerStart/Stop) around iterations --profile-step-start..--profile-step-end (inclusive,
numbered as the log numbers them), so `nsys profile --capture-range=cudaProfilerApi` records only
the steady steps. Megatron's own `--profile` is not used: it turns on per-op autograd NVTX ranges,
which make traces large. Under --fake-process-group (one rank of a layout on one GPU) the outputs
of the skipped collectives are filled with real-looking data first (fake_fill.py beside it).

Two shapes of Megatron's `pretrain` are served, told apart by its signature, not by a version:
  "0.19"   pretrain(cfg, datasets, model_type, forward_step): Megatron builds the GPT model from
           the args (megatron-core 0.19 and Megatron-LM trees of that era);
  "legacy" pretrain([cfg,] datasets, model_provider, model_type, forward_step): the entry builds
           the GPT model itself (megatron-core 0.17, 0.18, Megatron-LM trees back to core 0.15).
`python train_moe.py --moetune-check` imports what the run would import and prints one JSON line
saying whether it can run here (exit 0) or not (exit 3), without touching a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import sys
from functools import partial

CHECK = "--moetune-check"
NOT_RUNNABLE = 3
FIX = ("use an image with megatron-core >= 0.17, or set cluster.megatron_path to a Megatron-LM "
       "source tree (it has megatron/training)")
FIX_IMPORT = ("make the image's Megatron importable (the error named), or use an image with "
              "megatron-core >= 0.17")
FIX_RELEASE = ("use megatron-core 0.17, 0.18 or 0.19, or set cluster.megatron_path to a Megatron-LM "
               "source tree of those releases")

# What each entry takes from Megatron, as (module, name); the check imports exactly these.
_COMMON = (
    ("megatron.core.datasets.blended_megatron_dataset_builder", "BlendedMegatronDatasetBuilder"),
    ("megatron.core.datasets.gpt_dataset", "GPTDatasetConfig"),
    ("megatron.core.datasets.gpt_dataset", "MockGPTDataset"),
    ("megatron.core.enums", "ModelType"),
    ("megatron.training", "get_args"),
    ("megatron.training", "print_rank_0"),
    ("megatron.training.training", "pretrain"),
    ("megatron.training.training", "train_step"),
)
NEEDS = {
    "0.19": _COMMON + (
        ("megatron.core.tokenizers.utils.build_tokenizer", "build_tokenizer"),
        ("megatron.training.arguments", "parse_and_validate_args"),
        ("megatron.training.argument_utils", "gpt_config_from_args"),
        ("megatron.training.argument_utils", "pretrain_cfg_container_from_args"),
    ),
    "legacy": _COMMON + (
        ("megatron.training", "get_tokenizer"),
        ("megatron.training.arguments", "core_transformer_config_from_args"),
        ("megatron.core.models.gpt", "GPTModel"),
        ("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_decoder_block_spec"),
        ("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_with_transformer_engine_spec"),
        ("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec"),
        ("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_mtp_block_spec"),
    ),
}
# a legacy pretrain whose first argument is the config container (core 0.18) also needs its builders
CONTAINER_NEEDS = (
    ("megatron.training.arguments", "parse_and_validate_args"),
    ("megatron.training.argument_utils", "pretrain_cfg_container_from_args"),
)
DATASETS_PARAM = "train_valid_test_dataset_provider"


def api_of(pretrain) -> tuple[str | None, bool]:
    """("0.19" | "legacy" | None, whether pretrain takes a config container first)."""
    params = inspect.signature(pretrain).parameters
    if DATASETS_PARAM not in params:
        return None, False
    container = next(iter(params)) != DATASETS_PARAM
    provider = params.get("model_provider")
    if provider is not None and provider.default is inspect.Parameter.empty:
        return "legacy", container
    return ("0.19", True) if container else (None, False)


def _tree_of(module: str) -> str | None:
    """The folder of the `megatron` package that holds `module` (megatron is a namespace package
    in the wheels, so megatron.core and megatron.training may come from different installs)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return None
    path = os.path.dirname(os.path.abspath(spec.origin))  # the package's own folder
    for _ in range(module.count(".")):
        path = os.path.dirname(path)
    return path


def _version_at(tree: str) -> str | None:
    """megatron-core's own version string, read from its package_info.py alone (so it is known
    even where importing megatron.core fails)."""
    path = os.path.join(tree, "core", "package_info.py")
    try:
        spec = importlib.util.spec_from_file_location("_moetune_mcore_info", path)
        info = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(info)
        return str(info.__version__)
    except Exception:
        return None


def probe() -> tuple[dict, dict]:
    """The check's report, and the symbols the run uses ({} when it cannot run)."""
    report = {"megatron_core": None, "megatron_from": None, "training": False, "api": None,
              "entry": "ok", "fix": None}

    def refuse(why: str, fix: str = FIX):
        report.update(entry=why.replace("\n", " ")[:400], fix=fix)
        return report, {}

    try:
        core_tree = report["megatron_from"] = _tree_of("megatron.core")
        training_tree = _tree_of("megatron.training")
    except Exception as e:
        return refuse(f"megatron cannot be looked up: {type(e).__name__}: {e}", FIX_IMPORT)
    if core_tree is None:
        return refuse("no megatron.core on the path")
    version = report["megatron_core"] = _version_at(core_tree)
    if training_tree != core_tree:
        other = f"; the megatron.training at {training_tree} is another install's" if training_tree else ""
        return refuse(f"megatron-core {version} at {core_tree} has no megatron.training "
                      f"(megatron-core wheels ship it from 0.17){other}")
    report["training"] = True
    try:
        training = importlib.import_module("megatron.training.training")
    except Exception as e:
        return refuse(f"megatron {version}: import megatron.training.training failed: "
                      f"{type(e).__name__}: {e}", FIX_IMPORT)
    api, container = api_of(training.pretrain)
    report["api"] = api
    if api is None:
        params = ", ".join(inspect.signature(training.pretrain).parameters)
        return refuse(f"megatron {version}: pretrain({params}) is neither shape this entry knows",
                      FIX_RELEASE)
    symbols = {}
    for module, name in NEEDS[api] + (CONTAINER_NEEDS if container else ()):
        try:
            symbols[name] = getattr(importlib.import_module(module), name)
        except Exception as e:
            return refuse(f"megatron {version} lacks {module}.{name}, which the {api} entry uses "
                          f"({type(e).__name__}: {e})", FIX_RELEASE)
    symbols["container"] = container
    return report, symbols


def check() -> int:
    """Print the probe's one JSON line; everything Megatron prints while importing goes to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        report, _ = probe()
    print(json.dumps(report), flush=True)
    return 0 if report["entry"] == "ok" else NOT_RUNNABLE


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


def _accepted(fn, kwargs: dict) -> dict:
    """The keyword arguments `fn` takes: newer Megatrons add keywords (vp_stage, pg_collection,
    qk_l2_norm) that older ones refuse."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _note_layer_impl(m, args) -> None:
    if args.transformer_impl == "local" or not _te_available():
        m["print_rank_0"]("moetune: Transformer Engine absent or not asked for: local layer spec "
                          f"(--transformer-impl {args.transformer_impl})")


def gpt_model_provider(m: dict, pre_process=True, post_process=True, vp_stage=None, config=None,
                       pg_collection=None, **_):
    """The GPT model of the args, for a legacy pretrain (what Megatron-LM's pretrain_gpt.py builds
    for mcore models: a decoder block spec for MoE, MTP from the last layer's spec)."""
    args = m["get_args"]()
    if not vp_stage:
        _note_layer_impl(m, args)
    if config is None:  # older get_model passes no config
        config = m["core_transformer_config_from_args"](args)
    use_te = args.transformer_impl == "transformer_engine"
    if args.num_experts:
        spec_fn, spec_args = m["get_gpt_decoder_block_spec"], (config,)
        spec_kw = dict(use_transformer_engine=use_te, normalization=args.normalization,
                       qk_l2_norm=getattr(args, "qk_l2_norm", False), vp_stage=vp_stage)
    else:
        spec_fn = m["get_gpt_layer_with_transformer_engine_spec" if use_te else "get_gpt_layer_local_spec"]
        spec_args = ()
        spec_kw = dict(num_experts=None, moe_grouped_gemm=args.moe_grouped_gemm,
                       qk_layernorm=args.qk_layernorm, multi_latent_attention=args.multi_latent_attention,
                       normalization=args.normalization, qk_l2_norm=getattr(args, "qk_l2_norm", False))
    spec = spec_fn(*spec_args, **_accepted(spec_fn, spec_kw))
    mtp = None
    if getattr(args, "mtp_num_layers", None):
        fn = m["get_gpt_mtp_block_spec"]
        mtp = fn(config, spec, **_accepted(fn, dict(use_transformer_engine=use_te, vp_stage=vp_stage)))
    model_kw = dict(
        config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings, pre_process=pre_process,
        post_process=post_process, fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling, mtp_block_spec=mtp,
        vp_stage=vp_stage, pg_collection=pg_collection)
    if mtp is None:
        model_kw.pop("mtp_block_spec")
    if pg_collection is None:
        model_kw.pop("pg_collection")
    return m["GPTModel"](**_accepted(m["GPTModel"].__init__, model_kw))


def _profiled(train_step, get_args):
    """train_step inside an NVTX range `iteration N`, opening and closing the capture range."""
    import torch

    def profiled_train_step(*a, **kw):
        args = get_args()
        it = kw.get("iteration")
        it = (args.curr_iteration if it is None else it) + 1  # as the log counts
        if it == args.profile_step_start:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
        torch.cuda.nvtx.range_push(f"iteration {it}")
        try:
            out = train_step(*a, **kw)
            torch.cuda.synchronize()
        finally:
            torch.cuda.nvtx.range_pop()
        if it == args.profile_step_end:
            torch.cuda.cudart().cudaProfilerStop()
        return out

    return profiled_train_step


def _datasets_provider(m: dict, tokenizer):
    def datasets(num_samples, vp_stage=None):
        a = m["get_args"]()
        config_cls = m["GPTDatasetConfig"]
        fields = {f.name for f in dataclasses.fields(config_cls)}
        kw = dict(random_seed=a.seed, sequence_length=a.seq_length, blend=None,
                  blend_per_split=None, split=a.split, path_to_cache=None,
                  tokenizer=tokenizer(a), reset_position_ids=False, reset_attention_mask=False,
                  eod_mask_loss=False, mid_level_dataset_surplus=0.005,
                  # the forward passes no mask (the attention kernels apply causality), so a
                  # seq x seq mask a sample would only load the loader and its pinning thread
                  create_attention_mask=False)
        config = config_cls(**{k: v for k, v in kw.items() if k in fields})
        # every rank builds the same mock data (same seed), so no TP broadcast is needed
        return m["BlendedMegatronDatasetBuilder"](m["MockGPTDataset"], num_samples, lambda: True,
                                                  config).build()

    datasets.is_distributed = True
    return datasets


def reads_batch(model) -> bool:
    """Whether a model chunk reads a batch: as in Megatron's pretrain_gpt, only the chunk that
    embeds the tokens (the first pipeline stage's first virtual stage), the one that computes the
    loss (the last's last) and one holding MTP layers; the others take their input from the
    pipeline. Reading one on every chunk would add a loader fetch a virtual stage and micro-batch
    that no training has."""
    while hasattr(model, "module"):  # DDP and Float16Module wrap the GPT model
        model = model.module
    return any(bool(getattr(model, k, False)) for k in ("pre_process", "post_process", "mtp_process"))


def _forward_step():
    import torch

    def loss_func(loss_mask, output_tensor, model=None):
        losses = output_tensor.view(-1).float()
        mask = loss_mask.view(-1).float()
        loss = torch.sum(losses * mask)
        n = mask.sum().clone().detach().to(torch.int)
        return loss, n, {"lm loss": torch.cat([loss.clone().detach().view(1), n.view(1)])}

    def forward_step(data_iterator, model, return_schedule_plan: bool = False):
        tokens = labels = loss_mask = position_ids = None
        if reads_batch(model):
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

    return forward_step


ARGS_DEFAULTS = {"tokenizer_type": "NullTokenizer"}


def _fill_fake_buffers(argv: list[str]) -> bool:
    """Under --fake-process-group, fill what the skipped collectives would have written
    (fake_fill.py beside this file; the image lacks moetune, so it is loaded by its path). Before
    Megatron is imported: megatron-core binds torch.distributed's gather functions at import."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_fill.py")
    spec = importlib.util.spec_from_file_location("moetune_fake_fill", path)
    fill = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fill)
    return fill.install_for(argv)


def main() -> int:
    if CHECK in sys.argv[1:]:
        return check()
    _fill_fake_buffers(sys.argv[1:])
    report, m = probe()
    if report["entry"] != "ok":
        print(f"moetune: this Megatron cannot run the entry: {report['entry']}; {report['fix']}",
              file=sys.stderr, flush=True)
        return NOT_RUNNABLE
    from megatron.training import training as mtraining

    _ensure_dataset_makefile()
    mtraining.train_step = _profiled(m["train_step"], m["get_args"])
    model_type = m["ModelType"].encoder_or_decoder
    if report["api"] == "0.19":
        args = m["parse_and_validate_args"](args_defaults=ARGS_DEFAULTS)
        _note_layer_impl(m, args)
        full = m["pretrain_cfg_container_from_args"](args, m["gpt_config_from_args"](args))
        m["pretrain"](full, _datasets_provider(m, m["build_tokenizer"]), model_type, _forward_step())
    else:
        datasets = _datasets_provider(m, lambda a: m["get_tokenizer"]())
        provider = partial(gpt_model_provider, m)
        if m["container"]:
            args = m["parse_and_validate_args"](args_defaults=ARGS_DEFAULTS)
            m["pretrain"](m["pretrain_cfg_container_from_args"](args), datasets, provider,
                          model_type, _forward_step())
        else:  # this pretrain parses the args itself
            m["pretrain"](datasets, provider, model_type, _forward_step(), args_defaults=ARGS_DEFAULTS)
        args = m["get_args"]()
    if getattr(args, "fake_process_group", False) or int(os.environ.get("RANK", "0")) == 0:
        report_peak(args.train_iters)
    return 0


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
    # Replayed CUDA graphs allocate nothing, so their pools' tensors never show as allocated; what
    # the caching allocator still holds once its free blocks are released is live tensors plus pools
    torch.cuda.empty_cache()
    try:
        pooled = sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                     if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))
        pools = f"{pooled / mb:.2f}"
    except Exception:  # noqa: BLE001 - a torch without the snapshot's pool ids: the reserved figure stands
        pools = "unknown"
    print(f"[Rank {os.environ.get('RANK', '0')}] held after emptying the cache (MB) | "
          f"reserved: {torch.cuda.memory_reserved() / mb:.2f} | graph pools: {pools}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
