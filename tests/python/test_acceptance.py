"""conftest.accept's rule for gradients that sum over all rows (row_sum=True): a same-quality result whose error is
one final-rounding flip passes, clearly larger errors fail, NaN never passes (CPU)."""
import pytest
import torch

from conftest import accept, rounded_within

ULP = 2.0 ** -16  # bf16 spacing in [2^-9, 2^-8), where the largest elements lie (a mean loss's dgamma ~3e-3)


def bf16(t):
    return t.to(torch.float32).to(torch.bfloat16)


def _h200_like():
    """The H200 failure's shape of errors: 128 sums, the rest below 2^-9 (their roundings err by <= ULP / 4).
    Element 1: the unfused result is off by 0.43 ulp, its largest error. Element 0: ref64 0.01 ulp below a bf16
    value G; the unfused result rounds to G, coda's fp32 value was over half an ulp above and rounded to G + 1 ulp:
    1.01 ulp off, more than 2 x 0.43 ulp + 1e-6, though its error before the rounding may be under 2 x 0.43 ulp."""
    g = torch.Generator().manual_seed(0)
    ref = (torch.rand(128, generator=g, dtype=torch.float64) * 2 - 1) * 1.9e-3
    top, second = bf16(torch.tensor(2.98e-3)).item(), bf16(torch.tensor(2.5e-3)).item()
    ref[0], ref[1] = top - 0.01 * ULP, -(second + 0.43 * ULP)
    unfused = bf16(ref)
    coda = unfused.clone()
    coda[0] = top + ULP
    return coda, unfused, ref


def test_one_rounding_flip_passes_where_the_plain_rule_fails():
    coda, unfused, ref = _h200_like()
    with pytest.raises(AssertionError, match="2 x unfused"):
        accept("dgamma", coda, unfused, ref)
    accept("dgamma", coda, unfused, ref, row_sum=True)
    accept("dgamma", unfused, unfused, ref, row_sum=True)


def test_a_larger_error_in_one_element_fails():
    coda, unfused, ref = _h200_like()
    coda[0] = bf16(torch.tensor(ref[0].item() + 2 * ULP))  # 2 ulp: no rounding of a value within 0.93 ulp
    with pytest.raises(AssertionError, match="element 0 .* no torch.bfloat16 rounding"):
        accept("dgamma", coda, unfused, ref, row_sum=True)
    coda, unfused, ref = _h200_like()
    coda[7] = bf16(ref[7] * 1.1)  # a small element 10 % off
    with pytest.raises(AssertionError, match="element 7 "):
        accept("dgamma", coda, unfused, ref, row_sum=True)


@pytest.mark.parametrize("scale", [2.0 ** -7, 2.0 ** -6])
def test_a_wrong_scale_fails(scale):
    coda, unfused, ref = _h200_like()
    with pytest.raises(AssertionError):
        accept("dgamma", bf16(ref * (1 + scale)), unfused, ref, row_sum=True)


def test_an_error_in_every_element_fails_on_the_rms_even_where_each_is_within_rounding_reach():
    """Every element but the two largest scaled by 1 + 2^-7 (one ulp or more each, all below the max part's reach):
    only the root-mean-square part sees it."""
    coda, unfused, ref = _h200_like()
    coda[2:] = bf16(ref[2:] * (1 + 2.0 ** -7))
    assert rounded_within(coda, ref, 2 * (unfused.double() - ref).abs().max().item() + 1e-6).all()
    with pytest.raises(AssertionError, match="rms"):
        accept("dgamma", coda, unfused, ref, row_sum=True)


@pytest.mark.parametrize("where", ["coda", "coda inf", "unfused", "ref64"])
def test_nan_never_passes(where):
    coda, unfused, ref = _h200_like()
    if where == "coda":
        coda[3] = float("nan")
    elif where == "coda inf":
        coda[3] = float("inf")
    elif where == "unfused":
        unfused[3] = float("nan")
    else:
        ref[3] = float("nan")
    with pytest.raises(AssertionError):
        accept("dgamma", coda, unfused, ref, row_sum=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounded_within_is_exactly_the_roundings_of_the_interval(dtype):
    """Against brute force: the values that rounding any point of [ref - bound, ref + bound] gives (sampled finer
    than the dtype's spacing, ends included), among the dtype's values near ref."""
    g = torch.Generator().manual_seed(1)
    eps = torch.finfo(dtype).eps
    for _ in range(200):
        r = (torch.rand((), generator=g, dtype=torch.float64).item() * 2 - 1) * 3.0
        b = torch.rand((), generator=g, dtype=torch.float64).item() * 3 * eps * abs(r)
        hits = set(torch.linspace(r - b, r + b, 4001, dtype=torch.float64).to(torch.float32).to(dtype).tolist())
        base = torch.tensor(r).to(torch.float32).to(dtype)
        near = (base.view(torch.int16) + torch.arange(-8, 9, dtype=torch.int16)).view(dtype)
        got = rounded_within(near, torch.full(near.shape, r, dtype=torch.float64), b)
        assert got.tolist() == [v in hits for v in near.tolist()], (r, b)
