"""The rule engine: which fixes of `rules.yaml` answer an analysis, for this config and cluster.

    rules = load_rules()                       # the table, validated
    proposals(analysis, config, model, cluster, tuning=None, check=constraints.check)
        -> [Proposal(rule, config, refused)]   # matching rules, best first

A rule matches when all its metric conditions and preconditions hold; rules of the wall the
analysis named come first, then those of other walls whose evidence fired, then the rest (memory
rules only when memory fired). Its change
makes the new config; the constraint checker then judges it, and a refused change comes back with
`refused` holding the violations' reasons (the tuner records it as a skip).
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moetune import settings
from moetune.analysis.metrics import less_waiting
from moetune.analysis.walls import WALL_ORDER, memory_used_share
from moetune.errors import MoetuneError
from moetune.experiment import gpus as gpu_table
from moetune.experiment.config import TrainingConfig
from moetune.experiment.constraints import check as constraint_check
from moetune.experiment.schema import Cluster, Tuning

VERIFY_KINDS = ("flex_dispatch", "cuda_graphs", "fp8", "recompute", "overlap", "grouped_gemm", "none")

class RuleError(MoetuneError):
    """rules.yaml is malformed (one line: file, rule, key, what is allowed)."""


def _absent_ok_ne(a, b):
    return a != b


def _in(a, b):
    return a in b


def _has(a, b):
    return a is not None and b in a


# op -> (function(value, operand), True when a missing value passes)
OPS: dict[str, tuple[Callable[[Any, Any], bool], bool]] = {
    "eq": (operator.eq, False), "ne": (_absent_ok_ne, True),
    "gt": (operator.gt, False), "ge": (operator.ge, False),
    "lt": (operator.lt, False), "le": (operator.le, False),
    "in": (_in, False), "not_in": (lambda a, b: a not in b, True),
    "has": (_has, False), "lacks": (lambda a, b: not _has(a, b), True),
}
_MISSING = object()


@dataclass(frozen=True)
class Rule:
    id: str
    wall: str
    change: dict
    priority: int
    rationale: str
    source: str
    when: tuple = ()
    requires: tuple = ()
    verify: str = "none"
    one_gpu: bool = True  # one rank alone under the fake process group can show the fix

    def apply(self, config: TrainingConfig) -> TrainingConfig | None:
        """The changed config, or None when the change cannot be made (e.g. 1 // 2)."""
        current = config.to_dict()
        changes = {}
        for key, expr in self.change.items():
            value = _change_value(current[key], expr)
            if value is None and expr is not None:
                return None
            changes[key] = value
        return config.replace(**changes)


def _change_value(current, expr):
    if not isinstance(expr, dict):
        return expr
    (op, arg), = expr.items()
    if op == "mul":
        return current * arg if current else None
    if op == "div":
        return current // arg if current and current % arg == 0 and current // arg >= 1 else None
    if op == "add":
        items = list(current or ())
        return items if arg in items else items + [arg]
    raise ValueError(op)


@dataclass
class Proposal:
    rule: Rule
    config: TrainingConfig
    refused: list[str] = field(default_factory=list)  # constraint violations, "CODE: message"

    @property
    def ok(self) -> bool:
        return not self.refused


def load_rules(path: str | Path | None = None) -> list[Rule]:
    path = Path(path or settings.rules_file())
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RuleError(f"{path}: cannot read the rule table ({e})") from None
    fields_ = set(TrainingConfig().to_dict())
    out, seen = [], set()
    for i, raw in enumerate((data or {}).get("rules") or []):
        rid = raw.get("id", f"#{i}")
        where = f"{path}: rule {rid}"
        for key in ("id", "wall", "change", "priority", "rationale", "source"):
            if key not in raw:
                raise RuleError(f"{where}: missing key {key!r}")
        if rid in seen:
            raise RuleError(f"{where}: duplicate id")
        seen.add(rid)
        if raw["wall"] not in WALL_ORDER:
            raise RuleError(f"{where}: wall {raw['wall']!r} is not one of {WALL_ORDER}")
        if not isinstance(raw.get("one_gpu", True), bool):
            raise RuleError(f"{where}: one_gpu {raw['one_gpu']!r} must be true or false")
        if raw.get("verify", "none") not in VERIFY_KINDS:
            raise RuleError(f"{where}: verify {raw['verify']!r} is not one of {VERIFY_KINDS}")
        bad = sorted(set(raw["change"]) - fields_)
        if bad:
            raise RuleError(f"{where}: change names unknown config fields {bad}")
        for cond in list(raw.get("when") or []) + list(raw.get("requires") or []):
            if len(cond) != 3 or cond[1] not in OPS:
                raise RuleError(f"{where}: condition {cond} must be [path, op, value] with op in "
                                f"{sorted(OPS)}")
        out.append(Rule(id=rid, wall=raw["wall"], change=dict(raw["change"]),
                        priority=int(raw["priority"]), rationale=raw["rationale"],
                        source=raw["source"], when=tuple(map(tuple, raw.get("when") or ())),
                        requires=tuple(map(tuple, raw.get("requires") or ())),
                        verify=raw.get("verify", "none"), one_gpu=bool(raw.get("one_gpu", True))))
    return out


def load_fit_order(path: str | Path | None = None, rules: list[Rule] | None = None) -> tuple[str, ...]:
    """The table's `fit_order`: memory rules in the order a layout that does not fit tries them."""
    path = Path(path or settings.rules_file())
    rules = load_rules(path) if rules is None else rules
    memory = {r.id for r in rules if r.wall == "memory"}
    order = tuple((yaml.safe_load(path.read_text()) or {}).get("fit_order") or ())
    bad = [rid for rid in order if rid not in memory]
    if bad:
        raise RuleError(f"{path}: fit_order names {bad}, which are not memory rules of the table")
    return order


# -- the context conditions read ------------------------------------------------------------
def layout_facts(config: TrainingConfig, model: dict, cluster: Cluster, analysis: dict) -> dict:
    """The table's `derived.*` values: facts of the layout on this cluster (and the run's memory
    share) that no single field holds, for the rules' preconditions."""
    gpus = cluster.world
    per_node = cluster.gpus_per_node or gpus
    nvl = cluster.nvlink_domain
    etp = config.etp or config.tp
    dp = config.data_parallel(gpus)
    experts = int(model.get("num_experts") or 0)
    layers = int(model.get("num_layers") or 0)
    gpu_type = cluster.gpu_type
    mem_gb = analysis.get("gpu_memory_gb") or gpu_table.memory_gb(gpu_type)
    m = (analysis.get("metrics") or {}).get("combined") or {}
    expert_dp = gpus // max(config.pp * config.ep * etp, 1)
    return {
        "gpus": gpus,
        "dp": dp,
        "gpu_family": gpu_table.generation(gpu_type),
        "ep_in_nvlink": config.ep * etp <= nvl,
        "ep_cross_node": config.ep * etp > per_node,
        "vpp_ok": config.pp == 1 or config.vpp is not None,
        "memory_used_share": memory_used_share(m, analysis.get("log"), mem_gb),
        "micro_batch_doubled_fits": config.global_batch % (2 * config.micro_batch * max(dp, 1)) == 0,
        "ep_doubled_divides_experts": experts > 0 and experts % (2 * config.ep) == 0,
        "ep_doubled_fits_dp": expert_dp % 2 == 0,
        "ep_halved_divides": config.ep % 2 == 0,
        "pp_doubled_divides_layers": layers > 0 and layers % (2 * config.pp) == 0,
        "pp_doubled_fits": dp % 2 == 0,
    }


def _lookup(ctx: dict, path: str):
    cur: Any = ctx
    for part in str(path).split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return _MISSING
    return cur


def known(ctx: dict, path: str) -> bool:
    """Whether the context holds a value at the dotted `path` (absent or None: not known)."""
    value = _lookup(ctx, path)
    return value is not _MISSING and value is not None


def holds(cond, ctx: dict) -> bool:
    path, op, operand = cond
    fn, absent_ok = OPS[op]
    value = _lookup(ctx, path)
    if value is _MISSING or value is None and operand is not None:
        return absent_ok
    if isinstance(value, list):
        value = tuple(value)
    try:
        return bool(fn(value, operand))
    except TypeError:
        return False


def context(analysis: dict, config: TrainingConfig, model, cluster: Cluster,
            tuning: Tuning | None = None) -> dict:
    model_d, cluster_d = model.to_dict(), cluster.model_dump()
    metrics = dict(((analysis.get("metrics") or {}).get("combined")) or {})
    d = layout_facts(config, model_d, cluster, analysis)
    metrics.setdefault("memory_used_share", d["memory_used_share"])
    if "exposed_a2a_share" in metrics and "exposed_a2a_share_net" not in metrics:
        # analyses made before the metric existed
        metrics["exposed_a2a_share_net"] = less_waiting(metrics["exposed_a2a_share"],
                                                        metrics.get("a2a_wait_share") or 0.0)
    metrics["log_failure"] = (analysis.get("log") or {}).get("failure")
    cfg = config.to_dict()
    return {"metric": metrics, "config": cfg, "cluster": cluster_d, "model": model_d,
            "tuning": tuning.model_dump() if tuning is not None else {}, "derived": d}


def walls_in_order(analysis: dict) -> list[str]:
    """The named wall, then the other walls whose evidence fired (strongest first), then the
    remaining walls except memory (their rules' own metric conditions still gate them)."""
    order = []
    if analysis.get("wall") in WALL_ORDER:
        order.append(analysis["wall"])
    for ev in sorted(analysis.get("evidence") or [], key=lambda e: -float(e.get("strength") or 0)):
        w = ev.get("wall")
        if w in WALL_ORDER and w not in order:
            order.append(w)
    return order + [w for w in WALL_ORDER if w not in order and w != "memory"]


def matching(analysis: dict, config: TrainingConfig, model, cluster, tuning=None,
             rules: list[Rule] | None = None) -> list[Rule]:
    """Rules whose wall, metric conditions and preconditions hold, best first."""
    rules = load_rules() if rules is None else rules
    ctx = context(analysis, config, model, cluster, tuning)
    metric_ctx = dict(ctx, **ctx["metric"])
    walls = walls_in_order(analysis)
    hits = [r for r in rules if r.wall in walls
            and all(holds(c, metric_ctx) for c in r.when)
            and all(holds(c, ctx) for c in r.requires)]
    return sorted(hits, key=lambda r: (walls.index(r.wall), -r.priority))


def proposals(analysis: dict, config: TrainingConfig, model, cluster, tuning=None,
              check: Callable | None = None, rules: list[Rule] | None = None) -> list[Proposal]:
    """Each matching rule's changed config, checked; a no-op change is dropped."""
    check = check or constraint_check
    out = []
    for rule in matching(analysis, config, model, cluster, tuning, rules):
        new = rule.apply(config)
        if new is None or new == config:
            continue
        violations = check(new, model, cluster) or []
        out.append(Proposal(rule, new, [f"{v.code}: {v.message} ({v.source})" for v in violations]))
    return out
