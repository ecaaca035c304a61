"""How Megatron splits the decoder layers over pipeline stages, in each form it takes: evenly;
uneven first/last stages (--decoder-first/last-pipeline-num-layers); the embedding and the loss
counted as layers (--account-for-embedding/loss-in-pipeline-split); an explicit layout
(--pipeline-model-parallel-layout). Virtual stages (VPP) on all of them.

Sources: megatron/training/arguments.py (validate_args) and
megatron/core/transformer/{transformer_config.py, pipeline_parallel_layer_layout.py}.
"""
from __future__ import annotations

import re

from moetune.errors import MoetuneError

# E embedding, t decoder layer, m MTP layer, L loss; | ends a stage; (...)*n and x*n repeat;
# commas are cosmetic (Megatron drops them)
LAYOUT_CHARS = frozenset("EtmL|()*,0123456789")
# an expanded layout longer than this is not a model's (and would only cost memory)
MAX_LAYOUT_LENGTH = 100_000


class LayoutError(MoetuneError, ValueError):
    """A --pipeline-model-parallel-layout string Megatron cannot read (one line)."""


def expand_layout(text: str) -> list[str]:
    """The layout's stages in Megatron's flat order (virtual stage outer, pipeline rank inner),
    each a string of E, t, m, L; repeats unrolled as Megatron's parse_str_to_list does."""
    bad = sorted(set(text) - LAYOUT_CHARS)
    if bad:
        raise LayoutError(f"layout {text!r}: characters {''.join(bad)!r} unknown; use E t m L | ( ) * n")
    flat = text.replace(",", "")
    for pattern in (r"\(([^()]+)\)\*(\d+)", r"([^()|*\d])\*(\d+)"):
        try:
            flat = re.sub(pattern, lambda g: _repeat(g[1], int(g[2])), flat)
        except OverflowError:
            raise LayoutError(f"layout {text!r}: expands past {MAX_LAYOUT_LENGTH} characters") from None
    if set(flat) & set("()*0123456789"):
        raise LayoutError(f"layout {text!r}: a repeat is not of the form (...)*n or x*n")
    return flat.split("|")


def _repeat(unit: str, times: int) -> str:
    if len(unit) * times > MAX_LAYOUT_LENGTH:
        raise OverflowError
    return unit * times


def layout_stages(text: str) -> int:
    """Pipeline x virtual stages a layout string names (LayoutError where it cannot be read)."""
    return len(expand_layout(text))


def layout_problem(text: str, pp: int, num_layers: int, mtp_layers: int) -> str | None:
    """Why Megatron refuses the layout for PP `pp` and the model's layers, or None."""
    try:
        flat = expand_layout(text)
    except LayoutError as e:
        return str(e)
    if len(flat) % pp:
        return f"layout {text!r} has {len(flat)} stages, not a multiple of PP {pp}"
    joined = "".join(flat)
    if not joined.startswith("E") or not joined.endswith("L") or joined.count("E") != 1 or joined.count("L") != 1:
        return f"layout {text!r}: the embedding E must come once, first, and the loss L once, last"
    if joined.count("t") != num_layers:
        return f"layout {text!r} places {joined.count('t')} decoder layers (t); the model has {num_layers}"
    if joined.count("m") != mtp_layers:
        return f"layout {text!r} places {joined.count('m')} MTP layers (m); the model has {mtp_layers}"
    if "m" in joined and "t" in joined[joined.index("m"):]:
        return f"layout {text!r}: decoder layers must come before the MTP layers"
    vpp = len(flat) // pp
    for rank in range(pp):
        chunks = [flat[v * pp + rank] for v in range(vpp)]
        if any("m" in ch for ch in chunks[:-1]):
            return f"layout {text!r}: MTP layers must sit in a rank's last virtual stage"
    return None


def _spread(n: int, parts: int) -> list[int]:
    """`n` layers over `parts` chunks, as even as can be, the later chunks taking the remainder."""
    share, extra = divmod(n, max(parts, 1))
    return [share + (i >= parts - extra) for i in range(parts)]


def chunk_layers(num_layers: int, config) -> list[list[int]]:
    """Decoder layers of each [pipeline rank][virtual stage], as Megatron builds them. A split
    Megatron refuses (the constraint table says so) is spread as evenly as it goes, the later
    chunks taking the remainder, so that a refused layout can still be priced for its message."""
    pp = max(config.pp, 1)
    if config.pp_layout:
        try:
            flat = expand_layout(config.pp_layout)
        except LayoutError:
            flat = []
        if flat and len(flat) % pp == 0:
            vpp = len(flat) // pp
            return [[flat[v * pp + r].count("t") for v in range(vpp)] for r in range(pp)]
    vpp = max(config.vpp or 1, 1)
    if pp == 1:
        return [[num_layers]]
    if config.first_pp_layers is not None or config.last_pp_layers is not None:
        ends = {0: config.first_pp_layers, pp - 1: config.last_pp_layers}
        fixed = {r: n for r, n in ends.items() if n is not None}
        rest = [r for r in range(pp) if r not in fixed]
        middle = _spread(max(num_layers - sum(fixed.values()), 0), len(rest))
        per_rank = dict(zip(rest, middle, strict=True))
        per_rank.update(fixed)
        return [_spread(per_rank[r], vpp) for r in range(pp)]
    extra = int(config.account_for_embedding) + int(config.account_for_loss)
    flat_counts = _spread(num_layers + extra, pp * vpp)
    if config.account_for_embedding:
        flat_counts[0] -= 1
    if config.account_for_loss:
        flat_counts[-1] -= 1
    return [[flat_counts[v * pp + r] for v in range(vpp)] for r in range(pp)]


def mtp_rank(config, mtp_layers: int) -> int | None:
    """The pipeline rank that builds the MTP layers: the layout's, else the last stage."""
    if not mtp_layers:
        return None
    if config.pp_layout:
        try:
            flat = expand_layout(config.pp_layout)
        except LayoutError:
            flat = []
        pp = max(config.pp, 1)
        for i, chunk in enumerate(flat):
            if "m" in chunk:
                return i % pp
    return max(config.pp, 1) - 1


def split_problem(num_layers: int, config) -> str | None:
    """Why Megatron refuses the first/last, accounted or even split of `num_layers` over PP x VPP
    (None where it takes it; an explicit layout is layout_problem's)."""
    pp, vpp = config.pp, config.vpp
    if config.pp_layout or pp <= 1:
        return None
    if config.first_pp_layers is not None or config.last_pp_layers is not None:
        layers, middle = num_layers, pp
        for what, n in (("first", config.first_pp_layers), ("last", config.last_pp_layers)):
            if n is None:
                continue
            if n <= 0:
                return f"the {what} stage's layers ({n}) must be 1 or more"
            if vpp and n % vpp:
                return f"the {what} stage's {n} layers must split evenly over VPP {vpp}"
            layers, middle = layers - n, middle - 1
        if bool(layers > 0) != bool(middle) or layers < 0:
            return f"{max(layers, 0)} layers are left for {middle} middle stages; they must both be none or some"
        if middle and layers % (middle * (vpp or 1)):
            return (f"the {layers} middle layers must split evenly over {middle} middle stages"
                    + (f" × VPP {vpp}" if vpp else "") + "; change first/last stage layers, PP or VPP")
        return None
    extra = int(config.account_for_embedding) + int(config.account_for_loss)
    total = num_layers + extra
    if total % (pp * (vpp or 1)) == 0:
        return None
    counted = f"{num_layers} layers" + (" + embedding" if config.account_for_embedding else "") + (
        " + loss" if config.account_for_loss else "") + (f" = {total}" if extra else "")
    return (f"{counted} must split evenly over PP×VPP = {pp}×{vpp or 1} stages; change PP/VPP, set "
            "first/last stage layers, account for the embedding/loss, or give a layout")


def uneven_split(num_layers: int, pp: int, vpp: int | None = None) -> tuple[int | None, int | None]:
    """(first, last) stage layers that let Megatron split `num_layers` over PP (x VPP), the first
    and last stages lighter where they must differ (they hold the embedding and the loss):
    (None, None) where an even split works, or where no first/last pair does."""
    v = vpp or 1
    if pp <= 1 or num_layers % (pp * v) == 0:
        return None, None
    best: tuple[int, int, int, int, int] | None = None
    for first in range(v, num_layers, v):
        for last in range(v, num_layers - first + 1, v):
            middle = num_layers - first - last
            if (pp == 2 and middle) or (pp > 2 and (middle <= 0 or middle % ((pp - 2) * v))):
                continue
            heaviest = max(first, last, middle // (pp - 2) if pp > 2 else 0)
            # the lightest heaviest stage, then the first and last closest to the middle ones
            score = (heaviest, -(first + last), abs(first - last), first, last)
            if best is None or score < best:
                best = score
    return (None, None) if best is None else (best[3], best[4])


def split_fields(num_layers: int, pp: int, vpp: int | None) -> dict:
    """The TrainingConfig split fields for `num_layers` at PP (x VPP): even where it divides, else
    the lightest first/last stages that do (uneven_split), else the embedding and the loss counted
    as layers where that divides; else even (which the constraint table refuses, saying why)."""
    out: dict = {"first_pp_layers": None, "last_pp_layers": None, "pp_layout": None,
                 "account_for_embedding": False, "account_for_loss": False}
    stages = pp * (vpp or 1)
    if pp <= 1 or num_layers % stages == 0:
        return out
    first, last = uneven_split(num_layers, pp, vpp)
    if first is not None:
        return {**out, "first_pp_layers": first, "last_pp_layers": last}
    if (num_layers + 2) % stages == 0:
        return {**out, "account_for_embedding": True, "account_for_loss": True}
    return out


def splits(num_layers: int, pp: int, vpp: int | None) -> bool:
    """Whether some split of split_fields lets Megatron build `num_layers` over PP x VPP."""
    f = split_fields(num_layers, pp, vpp)
    return pp <= 1 or num_layers % (pp * (vpp or 1)) == 0 or f["first_pp_layers"] is not None \
        or f["account_for_embedding"]


def balanced_layout(num_layers: int, mtp_layers: int, pp: int, vpp: int | None) -> str | None:
    """A --pipeline-model-parallel-layout for `num_layers` over PP x VPP stages where no first/last
    or accounted split does: the middle stages `b` layers each, the first (with the embedding)
    and the last (with the MTP layers and the loss) sharing the rest, the last the lighter; as
    DeepSeek-V3's 61 layers over PP8 VPP4 run, Et|(tt|)*30mL. None where there are under 3 stages."""
    stages = pp * (vpp or 1)
    if pp <= 1 or stages < 3:
        return None
    for b in range(max(1, num_layers // stages), num_layers + 1):
        rest = num_layers - (stages - 2) * b
        if 0 <= rest <= 2 * b:
            last = rest // 2
            return f"E{'t' * (rest - last)}|({'t' * b}|)*{stages - 2}{'t' * last}{'m' * mtp_layers}L"
    return None
