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


def test_cluster_world_and_gpus():
    """The world size is the cluster's ranks: one per GPU; on nodes without GPUs, its tasks (else
    one) per node. A cluster that leaves gpus_per_node out has the schema's 8."""
    from moetune.experiment.schema import Cluster
    assert (Cluster(nodes=2, gpus_per_node=4).world, Cluster(nodes=2, gpus_per_node=4).gpus) == (8, 8)
    assert (Cluster(nodes=3).world, Cluster(nodes=3).gpus) == (24, 24)
    cpu = Cluster(nodes=3, gpus_per_node=0, ntasks_per_node=2)
    assert (cpu.world, cpu.gpus) == (6, 0)
    assert Cluster(nodes=3, gpus_per_node=0).world == 3


def test_cluster_cut_to_fewer_gpus():
    """with_gpus: part of one node, one GPU (a one-GPU study), or whole nodes of gpus_per_node."""
    from moetune.experiment.schema import Cluster
    c = Cluster(nodes=4, gpus_per_node=8)
    assert (c.with_gpus(4).nodes, c.with_gpus(4).world) == (1, 4)
    assert (c.with_gpus(1).nodes, c.with_gpus(1).gpus_per_node) == (1, 1)
    assert (c.with_gpus(16).nodes, c.with_gpus(16).world) == (2, 16)
    assert Cluster(gpus_per_node=0).with_gpus(1).world == 1


def test_a_stored_experiment_reads_back_typed(tmp_path):
    """The study's record of an experiment (to_stored, through the store's JSON) reads back as
    the same typed Experiment; a tuning key stored as None takes the schema's default."""
    import json

    from moetune.experiment.schema import Cluster, Experiment, Tuning
    from moetune.store import Store
    e = load_experiment("moe_proxy")
    store = Store(f"sqlite:///{tmp_path / 'm.db'}")
    store.create_study("s", e.model.name, {**e.to_stored(), "plan": {"world": e.cluster.world}})
    (study,) = store.studies()
    back = Experiment.from_stored(study.experiment)
    assert isinstance(back.cluster, Cluster) and isinstance(back.tuning, Tuning)
    assert isinstance(back.baseline, TrainingConfig)
    assert (back.name, back.model, back.cluster, back.tuning, back.baseline) == \
        (e.name, e.model, e.cluster, e.tuning, e.baseline)
    record = json.loads(json.dumps(e.to_stored()))
    record["tuning"]["patience"] = None
    assert Experiment.from_stored(record).tuning.patience == Tuning().patience


def test_a_stored_experiment_with_a_bad_key_is_one_line():
    """A stored cluster or tuning key the schema does not know (and set) is a one-line ConfigError."""
    from moetune.experiment.schema import Experiment
    record = load_experiment("moe_proxy").to_stored()
    with pytest.raises(ConfigError, match="cluster.gpus_per_nod: .*allowed keys") as err:
        Experiment.from_stored({**record, "cluster": {**record["cluster"], "gpus_per_nod": 4}})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="stored experiment moe_proxy: tuning.patience"):
        Experiment.from_stored({**record, "tuning": {"patience": 0}})


@pytest.mark.parametrize("key, text", [
    ("name", BASE.replace("name: x\n", "name: ../../etc/evil\n", 1)),
    ("name", BASE.replace("name: x\n", "name: a/b\n", 1)),
    ("name", BASE.replace("name: x\n", "name: ..\n", 1)),
    ("cluster.name", BASE.replace("gpu_type: H100", "gpu_type: H100, name: ../up")),
])
def test_a_name_that_is_a_path_is_refused(tmp_path, key, text):
    """An experiment or cluster name becomes a folder name: a separator or '..' is refused in one
    line naming the file, the key and what a name takes."""
    with pytest.raises(ConfigError) as err:
        load_experiment(_write(tmp_path, text))
    msg = str(err.value)
    assert f"bad.yaml: {key} " in msg and "letters, digits, '.', '_' and '-' only" in msg and "\n" not in msg


def test_a_name_with_dots_and_dashes_loads(tmp_path):
    """Letters, digits, '.', '_' and '-' make a name."""
    assert load_experiment(_write(tmp_path, BASE.replace("name: x\n", "name: My_exp-2.1\n", 1))).name == "My_exp-2.1"


def test_a_study_that_named_its_experiment_by_a_path_reads_back():
    """A stored record whose experiment is the YAML's path (as `moetune fit` stores it) still reads
    back: names are checked where they enter, not in the stored model."""
    from moetune.experiment.schema import Experiment
    record = {**load_experiment("moe_proxy").to_stored(), "experiment": "/some/where/moe_proxy.yaml"}
    assert Experiment.from_stored(record).name == "/some/where/moe_proxy.yaml"


def test_an_experiment_path_that_is_a_folder_or_binary(tmp_path):
    """A folder or a binary file given as the experiment is one line, not a traceback."""
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="dir.yaml: not a file"):
        load_experiment(folder)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="bin.yaml: not text") as err:
        load_experiment(binary)
    assert "\n" not in str(err.value)


def test_profiled_steps_is_refused_naming_the_keys_that_profile(tmp_path):
    """tuning.profiled_steps never reached a job; a YAML that sets it is one line naming the
    baseline keys that set the profiled steps."""
    path = tmp_path / "x.yaml"
    text = (load_experiment("moe_proxy").path.read_text()
            .replace("  patience: 3\n", "  patience: 3\n  profiled_steps: 10\n"))
    assert "profiled_steps: 10" in text
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: tuning.profiled_steps")
    assert "baseline.profile_step_start" in line and "profile_step_end" in line


def test_a_stored_study_that_set_profiled_steps_reads_back():
    """A study stored while the schema had tuning.profiled_steps reads back without it."""
    from moetune.experiment.schema import Tuning
    assert Tuning.from_stored({"budget_trials": 4, "profiled_steps": 3}).budget_trials == 4
