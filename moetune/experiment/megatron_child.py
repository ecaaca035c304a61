"""Megatron's own argument parsing and validation of moetune's jobs, run by the Megatron venv's
Python by its path (experiment/megatron_validate.py), not imported: stdin holds the jobs (argv, world
size, GPU generation, whether the image has TE, the job's environment), stdout one line of
answers after "@@": None where Megatron accepts a job, else its first error line (or, with MEMORY,
Megatron's theoretical memory report). Each job's environment is set in this process as the job
would have it, since Megatron reads some settings from it.
"""
import contextlib
import io
import json
import os
import sys
import types


def main() -> None:
    # torch and Megatron imported here: moetune's tests import this file to walk the package,
    # in a venv that has neither
    jobs, MEMORY, TE_VERSION = json.loads(sys.stdin.read())
    ENV_KEYS: set[str] = set()
    import torch
    # No GPU and no Transformer Engine here. Answer validate_args' device queries with the cluster's
    # GPU generation, and, for images that have TE, stand in for TE's fused RoPE kernel and TE's
    # version so the availability checks see what the job's image has. Flag checks themselves are
    # Megatron's own.
    CAPABILITY = (9, 0)
    torch.cuda.get_device_capability = lambda *a, **k: tuple(CAPABILITY)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        major=CAPABILITY[0], minor=CAPABILITY[1], name="stand-in", total_memory=80 << 30)
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.utils as mcore_utils
    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args
    from packaging.version import Version
    # TE's fused permutation ops (--moe-permute-fusion): None here, present in an image with TE
    fused_permutation = {n: getattr(moe_utils, n) for n in (
        "fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
        "fused_sort_chunks_by_index_with_probs", "fused_unpermute") if hasattr(moe_utils, n)}
    out: list = []
    for argv, world, CAPABILITY, has_te, env in jobs:  # noqa: B007 - the stand-ins above read it
        if has_te and rope_utils.fused_apply_rotary_pos_emb is None:
            rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None
        for name, op in fused_permutation.items():
            setattr(moe_utils, name, (op or (lambda *a, **k: None)) if has_te else op)
        mcore_utils._te_version = Version(TE_VERSION if has_te else "0.0.0")
        # the job's environment (job/render.py), and nothing left over from the argv before
        for k in ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update(env)
        ENV_KEYS = set(env)
        os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
        sys.argv = ["pretrain_gpt.py", *argv]
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                args = parse_args()
                validate_args(args, {"tokenizer_type": "NullTokenizer"})
                core_transformer_config_from_args(args)
                if MEMORY:
                    from megatron.training.theoretical_memory_usage import report_theoretical_memory
                    step = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
                    args.padded_vocab_size = -(-args.vocab_size // step) * step  # what the tokenizer sets
                    dp = args.data_parallel_size
                    mbs = max(1, args.global_batch_size // (args.micro_batch_size * dp))
                    out.append(list(report_theoretical_memory(args, num_microbatches=mbs)))
                    continue
            out.append(None)
        except SystemExit as e:
            out.append(f"argparse refused the arguments (exit {e.code})")
        except BaseException as e:
            msg = (str(e).strip().splitlines() or [""])[0]
            out.append(f"{type(e).__name__}: {msg}"[:400])
    print("@@" + json.dumps(out))


if __name__ == "__main__":
    main()
