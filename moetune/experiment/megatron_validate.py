"""Megatron's own argument checks on a rendered argv, run on the CPU in the megatron venv.

`validate(argvs, world_size)` runs, in one subprocess of `.venv-megatron/bin/python` (Python 3.12,
megatron-core 0.19.2): `parse_args` + `validate_args`, then builds the TransformerConfig from the args
(`core_transformer_config_from_args`), whose `__post_init__` holds checks validate_args misses.
Each argv gets `None` (accepted) or the first line of Megatron's refusal. `mcore="0.17"` runs the
same under an older megatron-core installed beside the venv's (scripts/megatron-venv puts it in
.venv-megatron/mcore-0.17 and the subprocess finds it first on PYTHONPATH).
"""
from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

from moetune import settings
from moetune.errors import MoetuneError
from moetune.experiment.config import TrainingConfig
from moetune.experiment.environment import config_env

MAIN_MCORE = "0.19"  # the venv's own megatron-core; the older ones are folders beside it
OLDER_MCORE = ("0.16", "0.17", "0.18")


class MegatronUnavailable(MoetuneError):
    """The megatron venv is missing; build it with scripts/megatron-venv."""


CHILD = Path(__file__).with_name("megatron_child.py")  # run by the venv's Python, by its path


def venv_python() -> Path:
    """The megatron venv's Python (settings: MEGATRON_VENV, else .venv-megatron here)."""
    return settings.megatron_venv() / "bin" / "python"


def available(mcore: str | None = None) -> bool:
    return venv_python().exists() and (mcore in (None, MAIN_MCORE) or mcore_folder(mcore).is_dir())


def mcore_folder(mcore: str) -> Path:
    """Where scripts/megatron-venv installs megatron-core `mcore` ("0.17": its latest patch release)."""
    return settings.megatron_venv() / f"mcore-{mcore}"


def subprocess_env(mcore: str | None = None) -> dict[str, str]:
    """The environment of a subprocess of the venv's Python that imports megatron-core `mcore`
    (None or MAIN_MCORE: the venv's own), with no GPU."""
    if not available(mcore):
        where = venv_python() if not venv_python().exists() else mcore_folder(mcore)
        raise MegatronUnavailable(f"{where} missing; run scripts/megatron-venv")
    env = settings.environ(CUDA_VISIBLE_DEVICES="")
    if mcore not in (None, MAIN_MCORE):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(mcore_folder(mcore)), env.get("PYTHONPATH")) if p)
    return env


CAPABILITY = {"hopper": (9, 0), "blackwell": (10, 0)}
TE_VERSION = "2.20.2"  # what Megatron's TE version checks are told an image with TE has (the device's)


def config_env_of_argv(argv: list[str]) -> dict[str, str]:
    """The config's part of the environment job/render.py gives the job that runs this argv
    (ENV_RULES on the config parsed back from it; no cluster's own variables). Megatron reads some
    of it in validate_args (TE CUDA graphs under expandable segments need NCCL_GRAPH_REGISTER=0), so
    the check runs with it."""
    try:
        config = TrainingConfig.from_args(argv).to_dict()
    except (TypeError, ValueError):  # an argv moetune did not render: Megatron's parser will say why
        config = {}
    return config_env(config)


def validate(argvs: list[list[str]], world_size: int | list[int],
             generation: str = "hopper", has_te: bool = True, memory: bool = False,
             envs: list[dict[str, str]] | None = None, mcore: str | None = None) -> list:
    """`envs`: each job's environment; by default the one job/render.py renders for it.
    `mcore`: the megatron-core minor version to check under (None: the venv's own, 0.19)."""
    env = subprocess_env(mcore)
    worlds = world_size if isinstance(world_size, list) else [world_size] * len(argvs)
    caps = [CAPABILITY[generation]] * len(argvs)
    envs = envs if envs is not None else [config_env_of_argv(a) for a in argvs]
    jobs = [(a, w, c, has_te, e) for a, w, c, e in zip(argvs, worlds, caps, envs, strict=False)]
    proc = subprocess.run([str(venv_python()), str(CHILD)], input=json.dumps([jobs, memory, TE_VERSION]),
                          capture_output=True, text=True, timeout=600, env=env)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    if proc.returncode != 0 or not marker:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise MegatronUnavailable(f"megatron validation did not run: {tail}")
    return json.loads(marker[-1][2:])


def theoretical_memory(argvs: list[list[str]], world_size: int | list[int]) -> list:
    """Megatron's own figure (megatron.training.theoretical_memory_usage), per argv:
    [weight_and_optimizer_mb, activation_mb, total_mb], or the refusal's text."""
    return validate(argvs, world_size, memory=True)


_FLAGS_PROBE = r'''
import argparse, json, sys
import megatron.training.arguments as arguments
class Caught(Exception):
    pass
def grab(self, *a, **k):
    raise Caught(sorted(self._option_string_actions))
argparse.ArgumentParser.parse_args = grab
sys.argv = ["pretrain_gpt.py"]
try:
    arguments.parse_args()
except Caught as c:
    print("@@" + json.dumps(c.args[0]))
'''


def known_flags(mcore: str | None = None) -> set[str]:
    """Every option string Megatron's own argument parser accepts (megatron-core `mcore`)."""
    proc = subprocess.run([str(venv_python()), "-c", _FLAGS_PROBE], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(mcore))
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    if not marker:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise MegatronUnavailable(f"megatron parser did not run: {tail}")
    return set(json.loads(marker[-1][2:]))


_PARSE_PROBE = r'''
import contextlib, io, json, sys
import megatron.training.arguments as arguments
sys.argv = ["pretrain_gpt.py"] + json.loads(sys.stdin.read())
err = io.StringIO()
try:
    with contextlib.redirect_stderr(err):
        arguments.parse_args()
    print("@@" + json.dumps(None))
except SystemExit:
    lines = [l for l in err.getvalue().splitlines() if l.strip()]
    print("@@" + json.dumps(lines[-1] if lines else "refused"))
'''


def parser_refusal(argv: list[str], mcore: str | None = None) -> str | None:
    """What Megatron's own argument parser says of an argv (an unknown argument, a value of the
    wrong type or outside its choices), or None; only parsing, not validate_args."""
    proc = subprocess.run([str(venv_python()), "-c", _PARSE_PROBE], input=json.dumps(list(argv)),
                          capture_output=True, text=True, timeout=300, env=subprocess_env(mcore))
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    if not marker:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise MegatronUnavailable(f"megatron parser did not run: {tail}")
    return json.loads(marker[-1][2:])


# Megatron's option strings, recorded from its parser (known_flags) so that a check needs no venv
FLAGS_FILE = Path(__file__).with_name("megatron_flags.txt")


def recorded_flags() -> frozenset[str]:
    lines = FLAGS_FILE.read_text().splitlines()
    return frozenset(ln.strip() for ln in lines if ln.strip() and not ln.startswith("#"))


def unknown_flags(argv: list[str]) -> list[str]:
    """The options in an argv that Megatron's parser does not have (it allows no abbreviations),
    each with the closest known one where there is one: ["--x (did you mean --y?)"]."""
    known = recorded_flags()
    out = []
    for token in argv:
        flag = token.split("=", 1)[0]
        if not flag.startswith("-") or flag in known or _is_number(flag):
            continue
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.8)
        out.append(flag + (f" (did you mean {close[0]}?)" if close else ""))
    return out


def check_extra_args(args: list[str]) -> str | None:
    """Why Megatron would not take an experiment's extra_args (options its parser lacks, else its
    parser's own refusal where the venv exists), or None."""
    unknown = unknown_flags(args)
    if unknown:
        return "not Megatron options: " + ", ".join(unknown)
    return parser_refusal(list(args)) if args and available() else None


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    print(validate([sys.argv[2:]], int(sys.argv[1]))[0] or "ok")
