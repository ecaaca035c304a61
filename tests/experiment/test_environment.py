"""experiment/environment.py, the job's environment: Megatron's validation runs with the environment the job gets (moetune/experiment/environment.py ENV_RULES).
Every job sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and megatron-core 0.19.2's
validate_args then refuses `--cuda-graph-impl transformer_engine` unless NCCL_GRAPH_REGISTER=0
(without it, such a job stops at start-up on the GPU)."""
import pytest

from moetune.experiment import megatron_validate as mv
from moetune.experiment.config import run_args
from moetune.experiment.environment import config_env
from tests.experiment.test_constraints import MODEL, OK

pytestmark = [pytest.mark.megatron,
              pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")]

TE_GRAPHS = OK.replace(cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn",))
WORLD = 16


def test_te_graphs_env_is_rendered():
    """TE CUDA graphs get NCCL_GRAPH_REGISTER=0 beside expandable segments, a config without them
    does not, and the validation's job_env is the rendered one."""
    env = config_env(TE_GRAPHS.to_dict())
    assert env["NCCL_GRAPH_REGISTER"] == "0" and "expandable_segments:True" in env["PYTORCH_CUDA_ALLOC_CONF"]
    assert "NCCL_GRAPH_REGISTER" not in config_env(OK.to_dict())
    assert mv.config_env_of_argv(TE_GRAPHS.to_args(MODEL) + run_args()) == env


def test_te_graphs_pass_with_the_job_env_and_fail_without_it():
    """Megatron 0.19.2 accepts TE graphs with the job's environment and refuses them without
    NCCL_GRAPH_REGISTER=0 under expandable segments; without expandable segments it accepts them:
    the environment decides."""
    argv = TE_GRAPHS.to_args(MODEL) + run_args()
    env = config_env(TE_GRAPHS.to_dict())
    without = {k: v for k, v in env.items() if k != "NCCL_GRAPH_REGISTER"}
    no_segments = {k: v for k, v in without.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    plain = OK.to_args(MODEL) + run_args()
    got = mv.validate([argv, argv, argv, plain], WORLD, envs=[env, without, no_segments, without])
    assert got[0] is None, got[0]
    assert got[1] and "NCCL_GRAPH_REGISTER=0" in got[1], got[1]
    assert got[2] is None  # no expandable segments, no refusal: the env is what decides
    assert got[3] is None
    assert mv.validate([argv], WORLD) == [None]  # the default is the rendered job env


def test_megatron_fsdp_gets_more_than_one_connection_and_megatron_needs_it():
    """FSDP with sequence parallelism gets CUDA_DEVICE_MAX_CONNECTIONS 8, where sequence parallelism
    alone gets 1 (and EP overlap keeps its 32); Megatron 0.19.2 accepts the FSDP argv with the
    rendered environment and refuses it with one connection."""
    fsdp = OK.replace(fsdp=True)
    env = config_env(fsdp.to_dict())
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8" and config_env(OK.to_dict())["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert config_env(fsdp.replace(overlap_ep_a2a=True).to_dict())["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    argv = fsdp.to_args(MODEL) + run_args()
    got = mv.validate([argv, argv], WORLD, envs=[env, {**env, "CUDA_DEVICE_MAX_CONNECTIONS": "1"}])
    assert got[0] is None, got[0]
    assert got[1] and "CUDA_DEVICE_MAX_CONNECTIONS" in got[1], got[1]
