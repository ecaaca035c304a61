"""A Megatron-LM command line (`pretrain_gpt.py ARGS`, a launcher before it or not) as an
experiment's parts: the model (ModelArch.from_args), the layout and fixes already on as the
baseline (TrainingConfig.from_args, the parser `moetune check` reads a command line with), and
what moetune does not model as `extra_args`.

Every flag lands in exactly one place: the model or the baseline, dropped with why (the trials'
measuring flags, experiment/measuring.py, and flags moetune renders itself from another field), or
extra_args. A flag moetune renders at a value its model cannot express (LayerNorm, a learned
position embedding, a non-gated MLP) refuses the command line whole in one line: moetune never
prices a model other than the one the command line trains.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, fields
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from moetune.experiment.config import APEX_LESS_FLAGS, FLAG_ALIASES, FLAGS, TE_LESS_FLAGS, TrainingConfig
from moetune.experiment.extra_args import controlled_flags, model_switches
from moetune.experiment.measuring import MEASURING
from moetune.experiment.model import ModelArch
from moetune.experiment.schema import ConfigError, one_line


class ImportRefused(ConfigError):
    """A Megatron command line moetune cannot model whole (one line naming every reason)."""


# flags without which the model is not known (Megatron reads the vocabulary from a tokenizer
# file otherwise, which moetune's trials do not have)
REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--num-experts",
            "--seq-length", "--vocab-size")
# model flags moetune renders at one value: the only one its model describes
FIXED = {"--normalization": ("RMSNorm", "LayerNorm (moetune models RMSNorm)"),
         "--position-embedding-type": ("rope", "a position embedding other than RoPE")}
# precisions moetune's trials do not run in (they run BF16)
OTHER_PRECISION = {"--fp16": "FP16 (moetune's trials run in BF16)"}
# flags moetune renders from another field; here they say nothing the fields do not
IMPLIED = {"--bf16": "moetune's trials run in BF16",
           "--max-position-embeddings": "moetune renders it equal to --seq-length (RoPE has no table)",
           **{f: "moetune sets it where the image or --transformer-impl local needs it"
              for f in TE_LESS_FLAGS + APEX_LESS_FLAGS},
           "--ckpt-format": "moetune's trials save no checkpoint; it renders fsdp_dtensor with "
                            "--use-megatron-fsdp, as Megatron FSDP requires"}
# launchers whose options come before the script; world = nodes x processes a node
NNODES = ("--nnodes",)
NPROC = ("--nproc-per-node", "--nproc_per_node")


@dataclass(frozen=True)
class Imported:
    """A Megatron command line as an experiment's parts."""
    model: ModelArch
    """The architecture its flags describe."""
    baseline: TrainingConfig
    """Its layout and fixes (measuring fields at moetune's defaults)."""
    extra_args: list[str]
    """Its flags moetune does not model, in order, as given."""
    dropped: list[tuple[str, str]]
    """(flag with its values, why) for each flag not carried."""
    world: tuple[int, int] | None
    """(nodes, GPUs a node) of a torchrun prefix, where it names both; else None."""
    batch_given: bool
    """The command line sets --global-batch-size (else Megatron's default applies)."""


def read_command(text: str) -> list[str]:
    """A command line as written in a file or a shell: `\\` continuations joined, comments and
    blank lines dropped, split the way a shell splits words; ConfigError where it cannot be."""
    try:
        return shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise ConfigError(f"the Megatron command line cannot be split into words ({e})") from None


def read_command_file(path: str | Path) -> list[str]:
    """The words of a command-line file; ConfigError (one line) where it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file; give a file holding a Megatron command line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        return read_command(text)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def split_equals(argv: list[str]) -> list[str]:
    """`--flag=value` as `--flag value`, the form the parsers here read."""
    out: list[str] = []
    for token in argv:
        out += token.split("=", 1) if token.startswith("--") and "=" in token else [token]
    return out


def split_launcher(words: list[str]) -> tuple[list[str], list[str]]:
    """(launcher, Megatron argv): the words up to and including the training script (a `.py`), and
    those after it; no launcher where the words start with a flag or name no script."""
    if not words or words[0].startswith("-"):
        return [], list(words)
    for i, word in enumerate(words):
        if word.endswith(".py"):
            return words[:i + 1], words[i + 1:]
    return [], list(words)


def launcher_world(launcher: list[str]) -> tuple[int, int] | None:
    """(nodes, processes a node) a torchrun prefix names; None where it names no fixed pair."""
    words = split_equals(launcher)

    def value(names: tuple[str, ...]) -> str | None:
        for i, w in enumerate(words[:-1]):
            if w in names:
                return words[i + 1]
        return None
    nodes, per_node = value(NNODES), value(NPROC)
    if per_node is None or not per_node.isdigit() or (nodes is not None and not nodes.isdigit()):
        return None  # "gpu", "auto" or an elastic "1:4" fix no world
    return int(nodes or 1), int(per_node)


def groups(argv: list[str]) -> list[tuple[str, list[str]]]:
    """The argv as (flag, its values) in order; a stray leading value keeps its own group."""
    out: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--") or not out:
            out.append((token, []))
        else:
            out[-1][1].append(token)
    return out


def _model_flags() -> set[str]:
    """The flags ModelArch.from_args reads (those to_args renders for the model section)."""
    return {flag for flag, key in controlled_flags().items() if key == "the model section"}


def import_argv(argv: list[str], name: str, where: str = "the Megatron command line") -> Imported:
    """The experiment parts of a Megatron argv (a launcher prefix allowed), its model named `name`.
    ImportRefused naming every reason where moetune cannot model it whole; ConfigError where a
    value cannot be read."""
    launcher, argv = split_launcher(argv)
    argv = split_equals(argv)
    controlled = controlled_flags()
    config_flags = {f.flag for f in FLAGS} | set(FLAG_ALIASES) | {"--seq-length"}
    model_flags = _model_flags()
    switches = model_switches()
    kept: list[str] = []
    extra: list[str] = []
    dropped: list[tuple[str, str]] = []
    refused: list[str] = []
    for flag, values in groups(argv):
        text = shlex.join([flag, *values])
        if not flag.startswith("--"):
            refused.append(f"{text!r} is a value with no flag before it")
        elif flag in MEASURING:
            dropped.append((text, MEASURING[flag].why))
        elif flag in FIXED:
            if values[:1] != [FIXED[flag][0]]:
                refused.append(f"{text} ({FIXED[flag][1]})")
        elif flag in OTHER_PRECISION:
            refused.append(f"{text} ({OTHER_PRECISION[flag]})")
        elif flag == "--max-position-embeddings" and values == [_value(argv, "--seq-length")]:
            continue  # what moetune renders itself: nothing to say
        elif flag in IMPLIED:
            dropped.append((text, IMPLIED[flag]))
        elif flag in model_flags and flag not in switches and len(values) != 1:
            refused.append(f"{flag} needs a value" if not values else f"{text} (one value only)")
        elif flag in model_flags or flag in config_flags:
            kept += [flag, *values]
        elif flag in controlled:  # rendered from a field: --recompute-method, offloading's switch
            kept += [flag, *values]
        else:
            extra += [flag, *values]
    given = set(kept)
    refused += [f"{f} missing (the model needs it)" for f in REQUIRED if f not in given]
    if "--swiglu" not in given and "--quick-geglu" not in given:
        refused.append("no --swiglu or --quick-geglu (moetune models gated MLPs only)")
    method = _value(kept, "--recompute-method")
    if method not in (None, "uniform"):
        refused.append(f"--recompute-method {method} (moetune models the uniform method)")
    if refused:
        raise ImportRefused(f"{where}: moetune cannot model it whole, nothing written: " + "; ".join(refused))
    if "--group-query-attention" not in given:  # Megatron reads --num-query-groups only with it
        kept = _without(kept, "--num-query-groups")
    try:
        raw = ModelArch.from_args(kept, name=name)
        model = TypeAdapter(ModelArch).validate_python({f.name: getattr(raw, f.name) for f in fields(raw)})
        baseline = TrainingConfig.from_args(kept, model)
    except ValidationError as e:
        raise ConfigError(f"{where}: {one_line(e, 'model')}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: a value cannot be read ({e})") from None
    return Imported(model, baseline, extra, dropped, launcher_world(launcher), "--global-batch-size" in given)


def _value(argv: list[str], flag: str) -> str | None:
    i = argv.index(flag) if flag in argv else -1
    return argv[i + 1] if 0 <= i < len(argv) - 1 else None


def _without(argv: list[str], flag: str) -> list[str]:
    out = [(f, v) for f, v in groups(argv) if f != flag]
    return [t for f, v in out for t in (f, *v)]
