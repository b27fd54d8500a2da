"""CODA under CUDA graph capture (torch.cuda.graph): a block's forward and backward captured on a stream libcoda
has not seen before (its first GEMM there allocates that stream's cuBLAS workspace inside the capture), then
replayed on new inputs. The replay must equal eager execution on the same inputs bit for bit: the same kernels in
the same order, and every CODA kernel is deterministic."""
import pytest
import torch

import coda
import inputs as I
from conftest import requires_gpu


def _block_step(m, y0, x0, pos, inv, gx2, gqkv):
    x2, qkv = m(y0, x0, pos, inv)
    # The weighted sums reach every output element, so every gradient depends on all of them.
    loss = (x2.float() * gx2).sum() + (qkv.float() * gqkv).sum()
    loss.backward()
    return x2, qkv


@requires_gpu
def test_gpu_block_forward_backward_replays_a_captured_graph():
    d, Fi, hq, hkv, hd, M = 512, 1024, 8, 2, 64, 1000  # M not a tile multiple
    m = coda.nn.LlamaBlock(d, Fi, hq, hkv, hd, 1e-5, dtype=torch.bfloat16, device="cuda")
    params = list(m.parameters())

    def fresh(seed):
        g = I.gen(seed)
        y0 = I.act(g, M, hq * hd).detach().to("cuda", torch.bfloat16).requires_grad_()
        x0 = I.act(g, M, d, scale=4.0).detach().to("cuda", torch.bfloat16).requires_grad_()
        gx2 = torch.randn(M, d, generator=g).cuda()
        gqkv = torch.randn(M, (hq + 2 * hkv) * hd, generator=g).cuda()
        return y0, x0, gx2, gqkv

    pos = I.positions(I.gen(5), M).cuda()
    inv = I.inv_freq(hd).float().cuda()

    # Static inputs, written in place before each replay; gradients set to None so the capture allocates them
    # (a captured backward then writes, not accumulates, them).
    static = fresh(1)
    for p in params:
        p.grad = None
    s = torch.cuda.Stream()  # new to libcoda: its first GEMM on it runs inside the capture
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        out = _block_step(m, static[0], static[1], pos, inv, static[2], static[3])
    captured = {"x2": out[0], "qkv": out[1], "dy0": static[0].grad, "dx0": static[1].grad,
                **{f"d{n}": p.grad for n, p in m.named_parameters()}}

    for seed in (2, 3):
        new = fresh(seed)
        with torch.no_grad():
            for dst, src in zip(static, new):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        got = {k: v.clone() for k, v in captured.items()}

        # Eager on the same inputs, on the default stream.
        for p in params:
            p.grad = None
        e = _block_step(m, *new[:2], pos, inv, *new[2:])
        want = {"x2": e[0], "qkv": e[1], "dy0": new[0].grad, "dx0": new[1].grad,
                **{f"d{n}": p.grad for n, p in m.named_parameters()}}
        torch.cuda.synchronize()
        for k in want:
            assert got[k] is not None and want[k] is not None, k
            assert torch.isfinite(got[k].float()).all(), f"{k}: non-finite in the replay"
            diff = (got[k].float() - want[k].float()).abs().max().item()
            assert torch.equal(got[k], want[k]), f"seed {seed}, {k}: replay differs from eager (max |diff| {diff:.3e})"
        for n, p in m.named_parameters():  # the graph's own gradient buffers again
            p.grad = captured[f"d{n}"]
