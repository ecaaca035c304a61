"""workloads/fake_fill.py: the outputs of the collectives the fake process group skips hold real-looking
data. The collectives run on the CPU under torch's own fake backend (world 4, rank 0) in
.venv-megatron's Python, as the job loads the module (by its path, no moetune)."""
import json
import subprocess

import pytest

from moetune.experiment import megatron_validate as mv
from moetune.paths import ROOT
from moetune.workloads import fake_fill

MODULE = ROOT / "moetune" / "workloads" / "fake_fill.py"
ENTRY = ROOT / "moetune" / "workloads" / "train_moe.py"
needs_venv = pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")


def test_filled_only_under_the_fake_group_and_unless_turned_off():
    argv = ["--num-layers", "2", "--fake-process-group"]
    assert fake_fill.wanted(argv, {}) and fake_fill.wanted(argv, {"MOETUNE_FILL_FAKE": "1"})
    assert not fake_fill.wanted(argv, {"MOETUNE_FILL_FAKE": "0"})
    assert not fake_fill.wanted(argv[:2], {})


def test_turned_off_it_says_so_and_wraps_nothing(capsys):
    assert not fake_fill.install_for(["--fake-process-group"], {"MOETUNE_FILL_FAKE": "0"})
    assert not fake_fill.installed()
    assert capsys.readouterr().out.strip() == (
        "moetune: fake process group: outputs of skipped collectives left unfilled (MOETUNE_FILL_FAKE=0)")
    assert not fake_fill.install_for(["--num-layers", "2"], {})
    assert capsys.readouterr().out == ""


# Each collective called on a fresh output of zeros under the fake group: as a fake backend that
# copies nothing would run it, with the module's fill after it (`own`; the venv's torch 2.13 copies
# inputs itself for the collectives), and as installed (`as_installed`: what the probe left to the
# backend stays the backend's). One JSON line of findings.
_RUN = r'''
import importlib.util, inspect, json, sys, warnings
import numpy as np
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
warnings.simplefilter("ignore")
spec = importlib.util.spec_from_file_location("fake_fill", sys.argv[1])
ff = importlib.util.module_from_spec(spec); spec.loader.exec_module(ff)
originals = {n: getattr(dist, n) for n in ff.WRAPPED}
assert ff.install_for(["--fake-process-group"], {})
wrapped = [n for n in ff.WRAPPED if getattr(dist, n) is not originals[n]]
dist.init_process_group("fake", store=FakeStore(), world_size=4, rank=0)
pair = dist.new_group([0, 1])
torch.manual_seed(0)

def stats(t):
    f = t.detach().float()
    return {"shape": list(t.shape), "dtype": str(t.dtype), "zeros": bool((f == 0).all()),
            "mean": f.mean().item(), "std": f.std().item()}

def calls():
    x = torch.randn(64, 32)  # rows of a token batch
    counts = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    out = {}
    o = torch.zeros(64, 32); dist.all_to_all_single(o, x)
    out["all_to_all_single"] = (o, torch.equal(o, x))
    o = torch.zeros(96, 32); dist.all_to_all_single(o, x, output_split_sizes=[24] * 4, input_split_sizes=[16] * 4)
    out["all_to_all_single_v"] = (o, torch.equal(o[:64], x) and torch.equal(o[64:], x[:32]))
    # split sizes as Megatron's dropless dispatcher passes them: numpy arrays
    o = torch.zeros(96, 32)
    dist.all_to_all_single(o, x, output_split_sizes=np.array([24] * 4), input_split_sizes=np.array([16] * 4))
    out["all_to_all_single_numpy"] = (o, torch.equal(o[:64], x) and torch.equal(o[64:], x[:32]))
    o = torch.zeros(64, 32, dtype=torch.bfloat16); dist.all_to_all_single(o, x.bfloat16(), group=pair)
    out["all_to_all_single_bf16"] = (o, torch.equal(o, x.bfloat16()))
    o = torch.zeros(8, dtype=torch.long); dist.all_to_all_single(o, counts)
    out["all_to_all_single_counts"] = (o, torch.equal(o, counts))
    outs = [torch.zeros(16, 32) for _ in range(4)]; dist.all_to_all(outs, list(x.chunk(4)))
    out["all_to_all"] = (torch.cat(outs), torch.equal(torch.cat(outs), x))
    for name in ("all_gather_into_tensor", "_all_gather_base"):
        o = torch.zeros(256, 32); getattr(dist, name)(o, x)
        out[name] = (o, torch.equal(o, x.repeat(4, 1)))
    slots = [torch.zeros(64, 32) for _ in range(4)]; dist.all_gather(slots, x)
    out["all_gather"] = (torch.cat(slots), all(torch.equal(s, x) for s in slots))
    for name in ("reduce_scatter_tensor", "_reduce_scatter_base"):
        o = torch.zeros(16, 32); getattr(dist, name)(o, x)
        out[name] = (o, torch.equal(o, x[:16]))  # rank 0's chunk
    o = torch.zeros(16, 32); dist.reduce_scatter(o, list(x.chunk(4)))
    out["reduce_scatter"] = (o, torch.equal(o, x[:16]))
    o = torch.zeros(64, 32); dist.irecv(o, src=1).wait()
    out["irecv"] = (o, True)
    o = torch.zeros(64, 32, dtype=torch.bfloat16); dist.recv(o, src=1)
    out["recv"] = (o, True)
    o = torch.zeros(64, 32, requires_grad=True); dist.recv(o, src=1)  # a leaf: written below autograd
    out["recv_leaf"] = (o, True)
    o, shape = torch.zeros(64, 32), torch.zeros(3, dtype=torch.long)
    ops = [dist.P2POp(dist.irecv, o, 1), dist.P2POp(dist.isend, x, 1), dist.P2POp(dist.irecv, shape, 1)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    out["batch_isend_irecv"] = (o, True)
    out["batch_isend_irecv_int"] = (shape, torch.equal(shape, torch.zeros(3, dtype=torch.long)))
    return {k: {**stats(t), "as_meant": bool(ok)} for k, (t, ok) in out.items()}

def skipped(name):
    """The collective as a fake backend that copies nothing runs it, wrapped as install() wraps it."""
    def skip(*a, **k):
        return None
    skip.__signature__ = inspect.signature(originals[name])
    return ff._wrapped(name, skip, ff._FILLS[name])

result = {"wrapped": wrapped, "backend_fills": sorted(ff._backend_fills())}
as_installed = {n: getattr(dist, n) for n in ff.COLLECTIVES}
for n in ff.COLLECTIVES:
    setattr(dist, n, skipped(n))
ff._state["backend_fills"] = frozenset()
result["own"] = calls()
# in place: the distributed optimizer gathers parameters into the buffer that holds its shard
buf = torch.randn(4, 16); before = buf.clone()
dist.all_gather_into_tensor(buf.view(-1), buf[1])
result["in_place_kept"] = torch.equal(buf, before)
for n, fn in as_installed.items():
    setattr(dist, n, fn)
ff._state["backend_fills"] = None
result["as_installed"] = calls()
ff.uninstall()
result["restored"] = all(getattr(dist, n) is originals[n] for n in ff.WRAPPED)
print("@@" + json.dumps(result))
'''


def _venv(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(mv.venv_python()), "-c", code, *args], capture_output=True, text=True,
                          timeout=300, env={**mv.subprocess_env(), **(env or {})}, cwd="/")


def _marked(proc: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[0][2:])


@pytest.fixture(scope="module")
def filled():
    return _marked(_venv(_RUN, str(MODULE)))


SHAPES = {"all_to_all_single": [64, 32], "all_to_all_single_v": [96, 32], "all_to_all_single_numpy": [96, 32],
          "all_to_all_single_bf16": [64, 32], "all_to_all_single_counts": [8], "all_to_all": [64, 32],
          "all_gather_into_tensor": [256, 32], "_all_gather_base": [256, 32], "all_gather": [256, 32],
          "reduce_scatter_tensor": [16, 32], "_reduce_scatter_base": [16, 32], "reduce_scatter": [16, 32],
          "irecv": [64, 32], "recv": [64, 32], "recv_leaf": [64, 32], "batch_isend_irecv": [64, 32],
          "batch_isend_irecv_int": [3]}
INTS = {"all_to_all_single_counts": "torch.int64", "batch_isend_irecv_int": "torch.int64"}
BF16 = {"all_to_all_single_bf16", "recv"}


@pytest.mark.megatron
@needs_venv
@pytest.mark.parametrize("how", ["own", "as_installed"])
@pytest.mark.parametrize("call", sorted(SHAPES))
def test_every_skipped_output_holds_real_looking_data(filled, call, how):
    """Shape and dtype unchanged; the collectives' outputs hold what the op's input says (the
    input's rows, the local shard in each slot, the own chunk) and look like it (unit-normal
    input: mean near 0, std near 1); a receive holds N(0, 1); an integer receive is left as it was."""
    got = filled[how][call]
    assert got["shape"] == SHAPES[call]
    assert got["dtype"] == INTS.get(call, "torch.bfloat16" if call in BF16 else "torch.float32")
    assert got["as_meant"], got
    if call == "batch_isend_irecv_int":
        assert got["zeros"]
    elif call == "all_to_all_single_counts":
        assert not got["zeros"] and got["mean"] == pytest.approx(31 / 8)
    else:
        assert not got["zeros"]
        assert abs(got["mean"]) < 0.25 and 0.7 < got["std"] < 1.3, got


@pytest.mark.megatron
@needs_venv
def test_install_wraps_each_call_and_uninstall_puts_them_back(filled):
    assert filled["wrapped"] == list(fake_fill.WRAPPED)
    assert filled["restored"]
    # the venv's torch copies inputs itself for the collectives; the probe sees it, so no copy runs twice
    assert set(filled["backend_fills"]) <= set(fake_fill.COLLECTIVES)


@pytest.mark.megatron
@needs_venv
def test_an_all_gather_into_its_own_buffer_keeps_the_other_slots(filled):
    """The distributed optimizer's parameter gather: the other ranks' slots hold those parameters'
    own values, which the fill leaves (it does not overwrite them with copies of this rank's shard)."""
    assert filled["in_place_kept"]


_GLOO = r'''
import importlib.util, json, sys
import torch, torch.distributed as dist
spec = importlib.util.spec_from_file_location("fake_fill", sys.argv[1])
ff = importlib.util.module_from_spec(spec); spec.loader.exec_module(ff)
calls = []
ff._tile = ff._random = lambda *a: calls.append(a)
ff.install()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[2], world_size=1, rank=0)
o = torch.zeros(4); dist.all_gather_into_tensor(o, torch.ones(4))
o = torch.zeros(4); dist.all_to_all_single(o, torch.ones(4))
got = {"fills": len(calls), "fake": ff._state["fake"], "out": o.tolist()}
# a gloo group left to the interpreter's exit can abort in its teardown (seen once in CI)
dist.destroy_process_group()
print("@@" + json.dumps(got))
'''


@pytest.mark.megatron
@needs_venv
def test_under_a_real_group_the_wrappers_only_call_through():
    import os
    port = str(20000 + os.getpid() % 20000)
    got = _marked(_venv(_GLOO, str(MODULE), port))
    assert got == {"fills": 0, "fake": False, "out": [1.0, 1.0, 1.0, 1.0]}


# The entry run as the job runs it, with Megatron's probe replaced: what was wrapped, and whether
# Megatron was imported, at the moment the entry reaches for Megatron.
_ENTRY = r'''
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("train_moe", sys.argv[1])
tm = importlib.util.module_from_spec(spec); spec.loader.exec_module(tm)
seen = {}
def probe():
    import torch.distributed as dist
    seen.update(wrapped=hasattr(dist.all_to_all_single, "_moetune_original"),
                megatron_imported="megatron.core" in sys.modules)
    return {"entry": "stopped here", "fix": "-"}, {}
tm.probe = probe
sys.argv = ["train_moe.py", *sys.argv[2:]]
rc = tm.main()
print("@@" + json.dumps({**seen, "rc": rc}))
'''


@pytest.mark.megatron
@needs_venv
@pytest.mark.parametrize("switch, wrapped", [("1", True), ("0", False)])
def test_the_entry_installs_it_before_megatron_under_the_fake_group(switch, wrapped):
    proc = _venv(_ENTRY, str(ENTRY), "--num-layers", "2", "--fake-process-group",
                 env={"MOETUNE_FILL_FAKE": switch})
    assert _marked(proc) == {"wrapped": wrapped, "megatron_imported": False, "rc": 3}
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("moetune: fake process group:")]
    assert len(said) == 1 and ("filling outputs" in said[0]) == wrapped


@pytest.mark.megatron
@needs_venv
def test_the_entry_wraps_nothing_without_the_fake_group():
    proc = _venv(_ENTRY, str(ENTRY), "--num-layers", "2")
    assert _marked(proc) == {"wrapped": False, "megatron_imported": False, "rc": 3}
    assert "fake process group" not in proc.stdout
