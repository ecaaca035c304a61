"""Real-looking data in the outputs of the collectives that megatron-core's --fake-process-group skips.

Under the fake group one process stands for one rank of a production layout and no collective or
pipeline transfer moves data, so an output holds whatever its fresh allocation held: uninitialised,
mostly zero memory. The expert GEMMs then multiply low-entropy data, which draws less power and
runs faster than on a cluster (an H100 ran a 16384x4096x3072 GEMM at 844 TFLOP/s on zeros, 751 on
random data). `install()` wraps the torch.distributed calls megatron-core 0.19.2 makes so that after
the skipped op its output holds:
  all-to-all (single, list)         the input's own elements, repeated to the output's length;
  all-gather (into tensor, _base,   the local shard in every slot; an all-gather whose input lies
             list)                  in its output (the distributed optimizer's parameter gather)
                                    is not filled here: the other slots hold those parameters'
                                    own values (a backend that copies tiles them itself);
  reduce-scatter (tensor, _base,    the rank's own chunk of the input;
                 list)
  pipeline receives (recv, irecv,   N(0, RECEIVE_STD): there is no input to copy.
    batch_isend_irecv's irecv)
Integer and bool outputs of the collectives are filled the same way: copies of valid local values,
so token counts and indices stay in range. An integer receive is left as it is (no valid value to
invent). broadcast is not wrapped: it works in place, and each rank's buffer already holds that
rank's own values (parameters built by the same initialisation, flags computed alike).

Newer torch fake backends copy inputs into outputs for some collectives themselves (the torch 2.13
of .venv-megatron does for equal splits); a probe on CPU tensors at the first call finds which, and
those are left to the backend so that no copy runs twice. All-to-alls with explicit split sizes are
always filled here. Runs inside the job: imports torch only. MOETUNE_FILL_FAKE=0 turns it off.
"""
from __future__ import annotations

import functools
import inspect
import os

ENV = "MOETUNE_FILL_FAKE"
FLAG = "--fake-process-group"
# Every layer normalises its input before its first GEMM, and Adam's step does not depend on the
# gradient's scale, so a received activation or gradient needs the right entropy, not its scale.
RECEIVE_STD = 1.0

COLLECTIVES = ("all_to_all_single", "all_to_all", "all_gather_into_tensor", "_all_gather_base",
               "all_gather", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter")
RECEIVES = ("recv", "irecv")
# what install() replaces on torch.distributed, in order
WRAPPED = COLLECTIVES + RECEIVES + ("batch_isend_irecv", "P2POp")

_state: dict = {"originals": {}, "fake": None, "backend_fills": None}


def wanted(argv, environ=os.environ) -> bool:
    """Whether a run of Megatron with `argv` gets its skipped collectives filled: it runs under
    the fake process group and MOETUNE_FILL_FAKE is not 0."""
    return FLAG in argv and environ.get(ENV, "1").strip() != "0"


def install_for(argv, environ=os.environ) -> bool:
    """Before Megatron is imported (it binds torch.distributed's functions at import): install the
    fill when `wanted`, and print one line saying so (or that it is off) under the fake group."""
    if FLAG not in argv:
        return False
    if not wanted(argv, environ):
        print(f"moetune: fake process group: outputs of skipped collectives left unfilled ({ENV}=0)",
              flush=True)
        return False
    install()
    print("moetune: fake process group: filling outputs of skipped collectives (all-to-all from "
          "the input, all-gather from the local shard, reduce-scatter from the own chunk, pipeline "
          f"receives N(0, {RECEIVE_STD:g})); {ENV}=0 turns it off", flush=True)
    return True


def installed() -> bool:
    """Whether torch.distributed's functions are wrapped now."""
    return bool(_state["originals"])


def install() -> None:
    """Wrap torch.distributed's collectives and receives (WRAPPED). The wrappers fill only while
    the default process group is the fake one; elsewhere they only call through."""
    import torch.distributed as dist

    if installed():
        return
    originals = {name: getattr(dist, name) for name in WRAPPED}
    _state.update(originals=originals, fake=None, backend_fills=None)
    for name in COLLECTIVES:
        setattr(dist, name, _wrapped(name, originals[name], _FILLS[name]))
    for name in RECEIVES:
        setattr(dist, name, _wrapped(name, originals[name], _fill_receive))
    dist.batch_isend_irecv = _batch(originals["batch_isend_irecv"], originals["irecv"])
    dist.P2POp = _p2p_op_class(originals["P2POp"])


def uninstall() -> None:
    """Put torch.distributed's own functions back."""
    import torch.distributed as dist

    for name, fn in _state["originals"].items():
        setattr(dist, name, fn)
    _state.update(originals={}, fake=None, backend_fills=None)


def _active() -> bool:
    """Whether the default group is the fake one (decided at the first call after it exists)."""
    if _state["fake"] is None:
        import torch.distributed as dist
        if not dist.is_initialized():
            return False
        _state["fake"] = dist.get_backend() == "fake"
    return _state["fake"]


def _no_grad():
    import torch
    return torch.no_grad()


def _wrapped(name: str, original, fill):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def call(*args, **kwargs):
        result = original(*args, **kwargs)
        if not _active():
            return result
        arguments = signature.bind(*args, **kwargs).arguments
        if name not in _backend_fills() or _split_sizes(arguments):
            with _no_grad():  # as a backend writes: below autograd, into leaves too
                fill(arguments)
        return result

    call._moetune_original = original  # type: ignore[attr-defined]
    return call


def _batch(original, irecv):
    @functools.wraps(original)
    def call(p2p_op_list):
        result = original(p2p_op_list)
        if _active():
            with _no_grad():
                for op in p2p_op_list:
                    if op.op is irecv:
                        _random(op.tensor)
        return result

    call._moetune_original = original  # type: ignore[attr-defined]
    return call


def _p2p_op_class(original):
    """P2POp accepting the wrapped irecv: torch checks that `op` is its own isend or irecv, and
    batch_isend_irecv's wrapper fills the receives it is given."""

    class P2POp(original):
        __doc__ = original.__doc__

        def __new__(cls, op, *args, **kwargs):
            return super().__new__(cls, getattr(op, "_moetune_original", op), *args, **kwargs)

        def __init__(self, op, *args, **kwargs):
            super().__init__(getattr(op, "_moetune_original", op), *args, **kwargs)

    P2POp._moetune_original = original  # type: ignore[attr-defined]
    return P2POp


# --- the fills, each on the bound arguments of the call -------------------------------------------

def _group_rank(arguments: dict) -> int:
    import torch.distributed as dist
    return dist.get_rank(arguments.get("group"))


def _split_sizes(arguments: dict) -> bool:
    """Whether an all-to-all was given split sizes (the probe only covers equal splits). Megatron's
    dropless dispatcher passes numpy arrays, whose truth value is not defined: their length is."""
    return any(arguments.get(key) is not None and len(arguments[key]) > 0
               for key in ("output_split_sizes", "input_split_sizes"))


def _fill_all_to_all_single(a: dict) -> None:
    out, inp = a["output"], a["input"]
    if out.data_ptr() == inp.data_ptr() and out.numel() == inp.numel():
        return  # in place: it holds its own values already
    if _overlaps(out, inp):
        inp = inp.clone()
    _tile(out, inp)


def _fill_all_to_all(a: dict) -> None:
    for out, inp in zip(a["output_tensor_list"], a["input_tensor_list"], strict=False):
        if out is not inp:
            _tile(out, inp)


def _fill_all_gather_into_tensor(a: dict) -> None:
    out, inp = a["output_tensor"], a["input_tensor"]
    if not _overlaps(out, inp):
        _tile(out, inp)


def _fill_all_gather(a: dict) -> None:
    inp = a["tensor"]
    for out in a["tensor_list"]:
        if not _overlaps(out, inp):
            _tile(out, inp)


def _fill_reduce_scatter_tensor(a: dict) -> None:
    out, inp = a["output"], a["input"]
    n = out.numel()
    if inp.numel() != n * _group_size(a) or not inp.is_contiguous():
        _tile(out, inp)
        return
    rank = _group_rank(a)
    own = inp.reshape(-1)[rank * n:(rank + 1) * n]
    if own.data_ptr() == out.data_ptr() and out.is_contiguous():
        return  # the output is the rank's chunk of the input: it holds its own values already
    if _overlaps(out, inp):
        own = own.clone()
    _tile(out, own)


def _fill_reduce_scatter(a: dict) -> None:
    chunks, rank = a["input_list"], _group_rank(a)
    own = chunks[rank] if rank < len(chunks) else chunks[0]
    if own is not a["output"]:
        _tile(a["output"], own)


def _fill_receive(a: dict) -> None:
    _random(a["tensor"])


def _group_size(arguments: dict) -> int:
    import torch.distributed as dist
    return dist.get_world_size(arguments.get("group"))


_FILLS = {"all_to_all_single": _fill_all_to_all_single, "all_to_all": _fill_all_to_all,
          "all_gather_into_tensor": _fill_all_gather_into_tensor,
          "_all_gather_base": _fill_all_gather_into_tensor, "all_gather": _fill_all_gather,
          "reduce_scatter_tensor": _fill_reduce_scatter_tensor,
          "_reduce_scatter_base": _fill_reduce_scatter_tensor, "reduce_scatter": _fill_reduce_scatter}


def _overlaps(a, b) -> bool:
    """Whether two tensors' memory overlaps (the span from first to last element)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def _tile(out, src) -> None:
    """`out`'s elements, in order, are `src`'s repeated (a few doubling copies, no allocation for
    contiguous outputs); random when `src` is empty."""
    import torch

    total, n = out.numel(), src.numel()
    if total == 0:
        return
    if n == 0:
        _random(out)
        return
    flat = out.view(-1) if out.is_contiguous() else torch.empty(total, dtype=out.dtype, device=out.device)
    first = min(n, total)
    flat[:first].copy_(src.reshape(-1)[:first])
    done = first
    while done < total:
        k = min(done, total - done)
        flat[done:done + k].copy_(flat[:k])
        done += k
    if not out.is_contiguous():
        out.copy_(flat.view(out.shape))


def _random(t) -> None:
    """Normal data in a floating-point buffer; integer and bool buffers are left as they are."""
    import torch

    if t.numel() == 0 or not t.is_floating_point():
        return
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        t.normal_(0.0, RECEIVE_STD)
    else:  # FP8 and other formats normal_ does not write
        t.copy_(torch.empty(t.shape, dtype=torch.bfloat16, device=t.device).normal_(0.0, RECEIVE_STD))


# --- which collectives the backend fills itself ----------------------------------------------------

def _backend_fills() -> frozenset:
    """The COLLECTIVES whose fake backend already leaves what the fill would write (probed once on
    small CPU tensors; a probe that fails counts as not filled). The probe calls all-to-all with
    equal splits only, so a call with split sizes is filled here whatever it finds."""
    if _state["backend_fills"] is None:
        _state["backend_fills"] = frozenset(name for name in COLLECTIVES if _probe(name))
    return _state["backend_fills"]


def _probe(name: str) -> bool:
    import warnings

    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    whole = torch.arange(1, 2 * world + 1, dtype=torch.float32)
    shard = torch.tensor([7.0, 9.0])
    slots = lambda: [torch.zeros(2) for _ in range(world)]  # noqa: E731
    args = {
        "all_to_all_single": (torch.zeros(2 * world), whole),
        "all_to_all": (slots(), list(whole.chunk(world))),
        "all_gather_into_tensor": (torch.zeros(2 * world), shard),
        "_all_gather_base": (torch.zeros(2 * world), shard),
        "all_gather": (slots(), shard),
        "reduce_scatter_tensor": (torch.zeros(2), whole),
        "_reduce_scatter_base": (torch.zeros(2), whole),
        "reduce_scatter": (torch.zeros(2), list(whole.chunk(world))),
    }[name]
    original = _state["originals"][name]
    try:
        want = [[t.clone() for t in a] if isinstance(a, list) else a.clone() for a in args]
        _FILLS[name](inspect.signature(original).bind(*want).arguments)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch marks the _base forms deprecated
            original(*args)
        got, expected = args[0], want[0]
        if isinstance(got, list):
            return all(torch.equal(g, w) for g, w in zip(got, expected, strict=True))
        return torch.equal(got, expected)
    except Exception:
        return False
