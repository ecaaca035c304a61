"""Reading a config section (a cluster, a tuning budget, a model) whatever class holds it: a dict,
a pydantic model, a dataclass or a namespace."""
from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any, Mapping


def get(obj: Any, key: str, default: Any = None) -> Any:
    """The section's value for `key`; `default` where it is absent or None."""
    value = obj.get(key, default) if isinstance(obj, Mapping) else getattr(obj, key, default)
    return default if value is None else value


def as_dict(obj: Any) -> dict:
    """The section as a new plain dict ({} for None)."""
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    for method in ("model_dump", "to_dict"):
        if hasattr(obj, method):
            return getattr(obj, method)()
    if is_dataclass(obj):
        return asdict(obj)
    return {k: v for k, v in vars(obj).items() if not k.startswith("_")}


def rank_count(cluster: Any) -> int:
    """The ranks of the training a layout is for: one per GPU; on a cluster section without GPUs
    (the CPU stand-in's), one per task."""
    per_node = get(cluster, "gpus_per_node") or get(cluster, "ntasks_per_node") or 1
    return int(get(cluster, "nodes", 1) or 1) * int(per_node)


def gpu_count(cluster: Any, per_node: int = 1) -> int:
    """nodes x gpus_per_node (`per_node` where the section does not say)."""
    return int(get(cluster, "nodes", 1) or 1) * int(get(cluster, "gpus_per_node", per_node) or per_node)
