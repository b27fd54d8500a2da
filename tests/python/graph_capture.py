"""Run by test_graph.py in a child process (a failed capture leaves the CUDA context and torch's RNG in capture
state, which would fail every later test in the same process).

A CODA block's forward and backward, warmed up on a side stream as PyTorch's CUDA-graph guide asks, then captured
with torch.cuda.graph on its own capture stream, which libcoda has not seen. The graph is replayed on new inputs:
- two replays of the same inputs are equal bit for bit (every CODA kernel is deterministic);
- a replay equals eager execution on the same inputs within one GEMM's rounding: |replay - eager| <= 2^-7 max|eager|
  per tensor. (A plain GEMM whose eager winner is cuBLAS runs a CODA kernel in the capture, so bit equality is not
  expected there; stale or missing work would differ by O(max|eager|).)
Exit status 0 and a last line "ok ..." when all holds; a message naming the tensor otherwise."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402,F401  (puts the checkout's python/ first on the path)
import coda  # noqa: E402
import inputs as I  # noqa: E402

D, FI, HQ, HKV, HD, M = 512, 1024, 8, 2, 64, 1000  # M not a tile multiple


def step(m, y0, x0, pos, inv, gx2, gqkv):
    x2, qkv = m(y0, x0, pos, inv)
    # Weighted sums over every output element, so every gradient depends on all of them.
    loss = (x2.float() * gx2).sum() + (qkv.float() * gqkv).sum()
    loss.backward()
    return x2, qkv


def fresh(seed):
    g = I.gen(seed)
    y0 = I.act(g, M, HQ * HD).detach().to("cuda", torch.bfloat16).requires_grad_()
    x0 = I.act(g, M, D, scale=4.0).detach().to("cuda", torch.bfloat16).requires_grad_()
    gx2 = torch.randn(M, D, generator=g).cuda()
    gqkv = torch.randn(M, (HQ + 2 * HKV) * HD, generator=g).cuda()
    return y0, x0, gx2, gqkv


def grads(m, y0, x0):
    return {"dy0": y0.grad, "dx0": x0.grad, **{f"d{n}": p.grad for n, p in m.named_parameters()}}


def main():
    m = coda.nn.LlamaBlock(D, FI, HQ, HKV, HD, 1e-5, dtype=torch.bfloat16, device="cuda")
    pos = I.positions(I.gen(5), M).cuda()
    inv = I.inv_freq(HD).float().cuda()
    static = fresh(1)

    side = torch.cuda.Stream()  # warm-up: handles, autotuning and lazy kernel loading happen here, not in capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for t in (static[0], static[1], *m.parameters()):
                t.grad = None
            step(m, *static[:2], pos, inv, *static[2:])
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    for t in (static[0], static[1], *m.parameters()):  # the capture allocates them: a replay writes, not adds
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # torch's own capture stream, not `side`
        out = step(m, *static[:2], pos, inv, *static[2:])
    captured = {"x2": out[0], "qkv": out[1], **grads(m, static[0], static[1])}
    params = dict(m.named_parameters())

    def replay(inputs):
        with torch.no_grad():
            for dst, src in zip(static, inputs):
                dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        return {k: v.clone() for k, v in captured.items()}

    for seed in (2, 3):
        new = fresh(seed)
        got, again = replay(new), replay(new)
        for p in params.values():
            p.grad = None
        e = step(m, *new[:2], pos, inv, *new[2:])
        want = {"x2": e[0], "qkv": e[1], **grads(m, new[0], new[1])}
        torch.cuda.synchronize()
        for k, w in want.items():
            g = got[k]
            if g is None or w is None:
                sys.exit(f"seed {seed}, {k}: no tensor (replay {g is not None}, eager {w is not None})")
            if not torch.isfinite(g.float()).all():
                sys.exit(f"seed {seed}, {k}: non-finite values in the replay")
            if not torch.equal(g, again[k]):
                sys.exit(f"seed {seed}, {k}: two replays of the same inputs differ")
            diff = (g.float() - w.float()).abs().max().item()
            scale = w.float().abs().max().item()
            if not diff <= 2.0 ** -7 * scale:
                sys.exit(f"seed {seed}, {k}: replay differs from eager by {diff:.3e} (max |eager| {scale:.3e})")
        for n, p in params.items():  # the graph's own gradient buffers again
            p.grad = captured[f"d{n}"]
    print(f"ok: {len(captured)} tensors, 2 inputs: replays deterministic and equal to eager")


if __name__ == "__main__":
    main()
