"""experiment/pipeline.py: Megatron's pipeline split in each of its forms (even, uneven first/last
stages, embedding and loss accounted, an explicit layout), with virtual stages, as Megatron's
validate_args and TransformerConfig take or refuse them."""
import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.pipeline import (
    LayoutError,
    chunk_layers,
    expand_layout,
    layout_problem,
    mtp_rank,
    split_fields,
    split_problem,
    uneven_split,
)

DEEPSEEK_LAYOUT = "Et*3|(tt|)*29m|L"  # DeepSeek-V3's: 61 layers and an MTP layer over 32 stages


def test_deepseek_layout_expands_as_megatron_reads_it():
    """The repeat and the x*n forms unroll; 32 stages: Ettt, 29 of tt, m, L."""
    stages = expand_layout(DEEPSEEK_LAYOUT)
    assert stages == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert expand_layout("E,t*2|t,tL") == ["Ett", "ttL"]  # commas are cosmetic


@pytest.mark.parametrize("text", ["Et$|L", "E(t|L", "Et*|L", "E(tt)*99999999|L"])
def test_unreadable_layouts_are_one_line(text):
    """Unknown characters, an unclosed repeat, a repeat without a count or past any model's size."""
    with pytest.raises(LayoutError) as e:
        expand_layout(text)
    assert "\n" not in str(e.value) and text in str(e.value)


def test_deepseek_layout_at_pp8_is_four_virtual_stages():
    """At PP 8 the 32 stages are 4 virtual stages a rank, rank r building stages r, r+8, ...: rank 0
    the embedding and 3 layers, then 2 and 2 and 2; the MTP layer on rank 6, the loss on rank 7."""
    c = TrainingConfig(pp=8, pp_layout=DEEPSEEK_LAYOUT)
    assert c.vpp == 4  # the layout's stages over PP
    chunks = chunk_layers(61, c)
    assert chunks[0] == [3, 2, 2, 2] and chunks[6] == [2, 2, 2, 0] and chunks[7] == [2, 2, 2, 0]
    assert sum(map(sum, chunks)) == 61 and mtp_rank(c, 1) == 6
    assert layout_problem(DEEPSEEK_LAYOUT, 8, 61, 1) is None and layout_problem(DEEPSEEK_LAYOUT, 16, 61, 1) is None


@pytest.mark.parametrize("pp, layers, mtp, words", [
    (5, 61, 1, "not a multiple of PP 5"),
    (8, 60, 1, "places 61 decoder layers"),
    (8, 61, 0, "places 1 MTP layers"),
])
def test_layouts_megatron_refuses(pp, layers, mtp, words):
    assert words in layout_problem(DEEPSEEK_LAYOUT, pp, layers, mtp)


def test_layout_needs_embedding_first_and_loss_last():
    assert "embedding E" in layout_problem("tE|L", 2, 1, 0)
    assert "before the MTP" in layout_problem("Em|tL", 2, 1, 1)


def test_embedding_and_loss_accounted_split_qwen3_235b_at_pp8_vpp4():
    """94 layers + embedding + loss = 96 over 32 virtual stages of 3: the first and the last take 2."""
    c = TrainingConfig(pp=8, vpp=4, account_for_embedding=True, account_for_loss=True)
    chunks = chunk_layers(94, c)
    assert chunks[0] == [2, 3, 3, 3] and chunks[7] == [3, 3, 3, 2] and all(r == [3] * 4 for r in chunks[1:7])
    assert split_problem(94, c) is None
    assert "94 layers = 94" not in (split_problem(94, c.replace(account_for_loss=False)) or "")
    assert "95 must split evenly" in split_problem(94, c.replace(account_for_loss=False))


@pytest.mark.parametrize("first, last, pp, vpp, words", [
    (3, 2, 16, None, None),  # DeepSeek-V3's: 56 middle layers over 14 stages
    (3, 2, 8, None, "56 middle layers must split evenly over 6 middle stages"),
    (4, 2, 16, 2, "55 middle layers must split evenly over 14 middle stages × VPP 2"),
    (3, 2, 16, 2, "first stage's 3 layers must split evenly over VPP 2"),
    (0, None, 4, None, "must be 1 or more"),
    (30, 31, 2, None, None),
    (30, 30, 2, None, "1 layers are left for 0 middle stages"),
])
def test_first_last_split_as_transformer_config_checks_it(first, last, pp, vpp, words):
    c = TrainingConfig(pp=pp, vpp=vpp, first_pp_layers=first, last_pp_layers=last)
    problem = split_problem(61, c)
    assert (problem is None) if words is None else (words in problem), problem


def test_uneven_split_finds_what_divides():
    """61 layers at PP 8: 6 and 7 at the ends, 8 in each middle stage; 94 at PP 8: 11 and 11 with 12;
    94 at PP 8 VPP 4 has no first/last split (94 is not a multiple of 4 less 24s), so split_fields
    counts the embedding and the loss instead; an even split needs none."""
    assert uneven_split(61, 8) == (6, 7)
    assert split_problem(61, TrainingConfig(pp=8, first_pp_layers=6, last_pp_layers=7)) is None
    assert uneven_split(94, 8) == (11, 11)
    assert uneven_split(94, 8, 4) == (None, None)
    assert split_fields(94, 8, 4)["account_for_embedding"] and split_fields(94, 8, 4)["account_for_loss"]
    assert split_fields(48, 8, None) == split_fields(1, 1, None)  # even: every split field unset


@pytest.mark.parametrize("layers,mtp,pp,vpp", [(61, 1, 8, 4), (61, 1, 16, None), (94, 0, 8, 4), (32, 0, 2, 5),
                                               (61, 0, 2, 6)])
def test_a_balanced_layout_is_one_megatron_takes(layers, mtp, pp, vpp):
    """A layout for any PP x VPP of 3 or more stages: Megatron's rules pass it, it has PP x VPP stages,
    no middle stage is lighter than the first or last, and DeepSeek-V3's PP8 VPP4 is its own form."""
    from moetune.experiment.pipeline import balanced_layout
    text = balanced_layout(layers, mtp, pp, vpp)
    assert text is not None and layout_problem(text, pp, layers, mtp) is None
    stages = [s.count("t") for s in expand_layout(text)]
    assert len(stages) == pp * (vpp or 1) and sum(stages) == layers
    assert min(stages[1:-1]) >= max(stages[0], stages[-1])
    if (layers, pp, vpp) == (61, 8, 4):
        assert text == "Et|(tt|)*30mL"
    assert balanced_layout(layers, mtp, 1, None) is None
