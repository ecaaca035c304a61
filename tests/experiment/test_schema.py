"""Experiment YAMLs: the shipped ones load; a wrong field names the file, the key and what is allowed."""
import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import ConfigError, list_experiments, load_experiment

PRODUCTION = ["qwen3_235b", "qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b", "mixtral_8x22b"]


def test_all_models_ship():
    """Every production experiment and the proxy are listed as shipped."""
    assert set(PRODUCTION + ["moe_proxy"]) <= set(list_experiments())


@pytest.mark.parametrize("name", PRODUCTION + ["moe_proxy"])
def test_loads_and_renders(name):
    """Each experiment loads, renders its expert count, and its argv parses back to the baseline."""
    e = load_experiment(name)
    argv = e.baseline.to_args(e.model)
    assert argv[argv.index("--num-experts") + 1] == str(e.model.num_experts)
    assert TrainingConfig.from_args(argv, e.model) == e.baseline


def test_published_sizes():
    """DeepSeek-V3's and Qwen3-235B's sizes are their published ones."""
    ds = load_experiment("deepseek_v3").model
    assert (ds.num_layers, ds.hidden_size, ds.num_experts, ds.moe_router_topk) == (61, 7168, 256, 8)
    assert ds.multi_latent_attention and ds.first_dense_layers == 3
    q = load_experiment("qwen3_235b").model
    assert (q.num_layers, q.num_experts, q.moe_ffn_hidden_size, q.num_query_groups) == (94, 128, 1536, 4)


def _write(tmp_path, text):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


BASE = """name: x
model: {name: x, num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_query_groups: 4,
        ffn_hidden_size: 128, moe_ffn_hidden_size: 64, num_experts: 4, moe_router_topk: 2,
        vocab_size: 100, seq_length: 128}
cluster: {gpu_type: H100}
"""


@pytest.mark.parametrize("text, fragment", [
    (BASE.replace("gpu_type: H100", "gpu_type: V100"), "cluster.gpu_type: 'V100' is not allowed; use one of 'A100', 'H100'"),
    (BASE.replace("gpu_type: H100", "gpu_type: H100, gpus_per_nod: 8"), "allowed keys"),
    (BASE.replace("num_experts: 4", "num_experts: many"), "model.num_experts"),
    (BASE + "baseline: {tp: 2, pipeline: 3}\n", "baseline: unknown training config keys ['pipeline']"),
    (BASE.replace("gpu_type: H100", "gpu_type: H100, postprocess: {where: cloud}"), "cluster.postprocess.where"),
    (BASE.replace("gpu_type: H100", "gpu_type: H100, postprocess: {memory: 4G}"), "allowed keys: where, partition, account, time_limit, mem, cpus_per_task"),
    ("name: [unclosed", "not valid YAML"),
    ("- a list", "expected a mapping"),
])
def test_bad_experiment_one_line(tmp_path, text, fragment):
    """Each bad experiment file is a one-line ConfigError naming the file and the fault."""
    with pytest.raises(ConfigError) as err:
        load_experiment(_write(tmp_path, text))
    msg = str(err.value)
    assert "bad.yaml" in msg and fragment in msg and "\n" not in msg


def test_unknown_experiment_lists_known():
    """An unknown experiment name is refused with the list of known ones."""
    with pytest.raises(ConfigError, match="known: .*qwen3_235b"):
        load_experiment("no_such_model")
