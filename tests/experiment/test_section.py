"""experiment/section.py: a config section read the same whatever holds it (a dict, a pydantic model, a
dataclass, a namespace), None read as absent, and the ranks and GPUs a cluster section gives."""
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from pydantic import BaseModel

from moetune.experiment.section import as_dict, gpu_count, get, rank_count


@dataclass
class DataCluster:
    nodes: int = 2
    gpus_per_node: int | None = 4


class ModelCluster(BaseModel):
    nodes: int = 2
    gpus_per_node: int | None = 4


HOLDERS = [{"nodes": 2, "gpus_per_node": 4}, DataCluster(), ModelCluster(),
           SimpleNamespace(nodes=2, gpus_per_node=4)]


@pytest.mark.parametrize("section", HOLDERS, ids=["dict", "dataclass", "pydantic", "namespace"])
def test_every_holder_reads_the_same(section):
    """get, as_dict, rank_count and gpu_count give the same answers for each kind of holder."""
    assert get(section, "nodes") == 2 and get(section, "absent", "d") == "d"
    assert as_dict(section) == {"nodes": 2, "gpus_per_node": 4}
    assert rank_count(section) == 8 and gpu_count(section) == 8


def test_none_is_absent():
    """A key set to None reads as its default, and as_dict(None) is empty."""
    assert get({"gpus_per_node": None}, "gpus_per_node", 8) == 8
    assert get(DataCluster(gpus_per_node=None), "gpus_per_node", 8) == 8
    assert as_dict(None) == {}


def test_a_cpu_cluster_counts_its_tasks_as_ranks():
    """Without GPUs, ranks are tasks per node times nodes; gpu_count takes the default per node."""
    cpu = {"nodes": 3, "ntasks_per_node": 2}
    assert rank_count(cpu) == 6 and gpu_count(cpu) == 3 and gpu_count(cpu, per_node=8) == 24
    assert rank_count({}) == 1


def test_as_dict_is_a_copy():
    """Changing the dict as_dict returns leaves the section as it was."""
    section = {"nodes": 1}
    as_dict(section)["nodes"] = 9
    assert section == {"nodes": 1}
