"""The job's training entry (moetune/workloads/train_moe.py) against real megatron-core releases on the
CPU: 0.19.2 in .venv-megatron and 0.16.1, 0.17.1, 0.18.2 beside it (scripts/megatron-venv), each
selected by putting its folder first on PYTHONPATH."""
import json
import subprocess
from dataclasses import replace

import pytest

from moetune import settings
from moetune.paths import ROOT
from moetune.experiment import megatron_validate as mv
from moetune.experiment.config import run_args
from moetune.experiment.schema import load_experiment

pytestmark = [pytest.mark.megatron,
              pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")]

ENTRY = ROOT / "moetune" / "workloads" / "train_moe.py"
CONTRACT = {"megatron_core", "megatron_from", "training", "api", "entry", "fix"}
# each release the entry runs on, and the shape of its pretrain()
MEGATRON_VERSIONS = {"0.17": "legacy", "0.18": "legacy", "0.19": "0.19"}


def _run(version: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(mv.venv_python()), *args], capture_output=True, text=True,
                          timeout=timeout, env=mv.subprocess_env(version), cwd="/")


def _check(version: str) -> tuple[int, dict]:
    proc = _run(version, str(ENTRY), "--moetune-check")
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr[-2000:]
    return proc.returncode, json.loads(lines[0])


@pytest.mark.parametrize("version", MEGATRON_VERSIONS)
def test_megatron_version_check_says_the_entry_runs(version):
    """--moetune-check under megatron-core 0.17/0.18/0.19: one JSON line of exactly the contract's
    keys, exit 0, the version and install it found, and the pretrain shape it will drive."""
    rc, report = _check(version)
    assert set(report) == CONTRACT
    assert (rc, report["entry"], report["fix"], report["training"]) == (0, "ok", None, True), report
    assert report["megatron_core"].startswith(version + ".")
    assert report["api"] == MEGATRON_VERSIONS[version]
    home = mv.mcore_folder(version) if version != mv.MAIN_MCORE else settings.megatron_venv()
    assert report["megatron_from"].startswith(str(home)) and report["megatron_from"].endswith("megatron")


def test_megatron_version_0_16_is_refused_by_the_check():
    """megatron-core 0.16 has no megatron.training (even with the venv's 0.19 training package
    further down the path): exit 3, the version it found, and the one-line fix."""
    rc, report = _check("0.16")
    assert set(report) == CONTRACT
    assert rc == 3
    assert report["megatron_core"].startswith("0.16.")
    assert (report["training"], report["api"]) == (False, None)
    assert "0.16" in report["entry"] and "no megatron.training" in report["entry"]
    assert "megatron-core >= 0.17" in report["fix"] and "cluster.megatron_path" in report["fix"]
    assert "\n" not in report["entry"] + report["fix"]


def test_megatron_version_0_16_run_stops_before_training():
    """The real run (no --moetune-check) under megatron-core 0.16 exits 3 with the check's reason
    on stderr, before Megatron parses an argument or touches a device."""
    proc = _run("0.16", str(ENTRY), "--num-layers", "2")
    assert proc.returncode == 3
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("moetune:")]
    assert len(line) == 1 and "0.16" in line[0] and "cluster.megatron_path" in line[0]


# Builds the entry's own GPT model provider the way get_model of 0.17/0.18 calls it (config and
# pg_collection given). Only the build: the forward needs CUDA (Megatron's kernels and streams).
_BUILD = r'''
import importlib.util, json, os, sys
entry, argv = sys.argv[1], json.loads(sys.argv[2])
os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(20000 + os.getpid() % 20000))
spec = importlib.util.spec_from_file_location("train_moe", entry)
tm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tm)
report, m = tm.probe()
import torch
from megatron.training.arguments import parse_args, validate_args
from megatron.training.global_vars import set_global_variables
from megatron.core import parallel_state
from megatron.core.process_groups_config import ProcessGroupCollection
sys.argv = ["train_moe.py", *argv]
args = parse_args()
validate_args(args, tm.ARGS_DEFAULTS)
set_global_variables(args)
torch.distributed.init_process_group("gloo", world_size=1, rank=0)
parallel_state.initialize_model_parallel()
model = tm.gpt_model_provider(m, pre_process=True, post_process=True,
                              config=m["core_transformer_config_from_args"](args),
                              pg_collection=ProcessGroupCollection.use_mpu_process_groups())
moe = [type(layer.mlp).__name__ for layer in model.decoder.layers]
print("@@" + json.dumps({"api": report["api"], "model": type(model).__name__, "mlp": moe,
                         "mtp": getattr(model, "mtp", None) is not None,
                         "params": sum(p.numel() for p in model.parameters())}))
'''


def _tiny_argv() -> list[str]:
    """moe_proxy's rendered argv at a size a CPU builds in seconds, on one rank. The all-gather
    dispatcher: the all-to-all one opens a CUDA stream when built."""
    e = load_experiment("moe_proxy")
    model = replace(e.model, num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2,
                    kv_channels=32, ffn_hidden_size=256, moe_ffn_hidden_size=64, num_experts=4,
                    moe_router_topk=2, vocab_size=512, seq_length=64)
    cfg = e.baseline.replace(tp=1, ep=1, micro_batch=1, global_batch=1, dispatcher="allgather")
    return cfg.to_args(model) + run_args() + ["--use-cpu-initialization"]


@pytest.mark.parametrize("version", ["0.17", "0.18"])
def test_megatron_version_legacy_model_provider_builds_on_cpu(version):
    """Under megatron-core 0.17 and 0.18 the entry's own model provider builds the GPT model from a
    rendered argv: MoE layers from the decoder block spec, and an MTP block when asked for."""
    argv = _tiny_argv()
    proc = _run(version, "-c", _BUILD, str(ENTRY), json.dumps(argv + ["--mtp-num-layers", "1"]))
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    assert marker, proc.stderr[-3000:]
    built = json.loads(marker[-1][2:])
    assert built["api"] == "legacy" and built["model"] == "GPTModel"
    assert built["mlp"] == ["MoELayer", "MoELayer"] and built["mtp"] is True
    assert built["params"] > 100_000


# The chunks a pipeline rank holds, built by the entry's provider with each stage's flags, and the
# entry's mock data as its dataset provider builds it.
_CHUNKS = _BUILD.split("model = tm.gpt_model_provider")[0] + r'''
config = m["core_transformer_config_from_args"](args)
groups = ProcessGroupCollection.use_mpu_process_groups()
reads = {}
for pre, post in ((True, False), (False, False), (False, True), (True, True)):
    chunk = tm.gpt_model_provider(m, pre_process=pre, post_process=post, config=config,
                                  pg_collection=groups)
    wrapped = type("Wrapper", (torch.nn.Module,), {})()
    wrapped.module = chunk  # as DDP and Float16Module hold it
    reads[f"{pre},{post}"] = [tm.reads_batch(chunk), tm.reads_batch(wrapped)]
train = tm._datasets_provider(m, lambda a: m["get_tokenizer"]())([4, 0, 0])[0]
print("@@" + json.dumps({"reads": reads, "keys": sorted(train[0])}))
'''


@pytest.mark.parametrize("version", ["0.17", "0.18"])
def test_megatron_version_only_first_and_last_chunks_read_a_batch(version):
    """As Megatron's pretrain_gpt: a chunk reads a batch only where it embeds tokens or computes the
    loss (wrapped or not), and the mock samples carry no attention mask (the forward passes none)."""
    proc = _run(version, "-c", _CHUNKS, str(ENTRY), json.dumps(_tiny_argv()))
    marker = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    assert marker, proc.stderr[-3000:]
    got = json.loads(marker[-1][2:])
    assert got["reads"] == {"True,False": [True, True], "False,False": [False, False],
                            "False,True": [True, True], "True,True": [True, True]}
    assert "tokens" in got["keys"] and "attention_mask" not in got["keys"]
