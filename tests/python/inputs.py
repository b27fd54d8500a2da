"""Random inputs of realistic scale (PROTOCOL.md): weights ~N(0, 0.02), norm weights around 1 with spread,
activations ~N(0, 1), residuals larger. Fresh per call (seeded for reproducibility of a failure)."""
import torch


def gen(seed):
    return torch.Generator().manual_seed(seed)


def act(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).requires_grad_()


def weight(g, out_f, in_f):
    return (torch.randn(out_f, in_f, generator=g, dtype=torch.float64) * 0.02).requires_grad_()


def norm(g, d):
    return (1.0 + 0.2 * torch.randn(d, generator=g, dtype=torch.float64)).requires_grad_()


def inv_freq(hd, theta=500000.0):
    # fp32 values (the kernels take fp32 inv_freq), held in float64
    return (1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)).float().double()


def positions(g, *shape, jump=True):
    """Token positions: ascending per sequence, with a jump (packed sequences) and large values (> 100k)."""
    n = shape[-1]
    p = torch.arange(n, dtype=torch.int64).expand(*shape).clone()
    if jump and n > 4:
        p[..., n // 2:] = p[..., n // 2:] - n // 2 + int(torch.randint(100_000, 200_000, (1,), generator=g))
    return p
