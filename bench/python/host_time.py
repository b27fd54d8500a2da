"""Host (CPU) time of one CODA block call, layer by layer of the Python stack (issue 7: the per-call block numbers
count the time before the first kernel starts).

    python bench/python/host_time.py --config llama3-1b:8192 [--cprofile]

For the forward and the forward+backward it times, without synchronizing inside a batch of --calls calls (the GPU
falls behind, so the CPU never waits on it; a synchronize ends each batch, outside the timing):
  nn      coda.ops.block with autograd (what a training step runs), and its backward through autograd; in eager
          mode on plain tensors this goes through coda's autograd.Function fast path (coda._library._eager), not the
          torch.library dispatcher
  op      the torch.library custom op (coda::block_forward / coda::block_backward) called directly: the path under
          torch.compile and tracing (not a layer of the `nn` row)
  kernels coda._kernels.block_forward / block_backward (output allocation, descriptors, the C call)
  c_abi   the C call alone, descriptors built beforehand (libcoda's validation, dispatch and launches)
Differences between the nn, kernels and c_abi rows are what each layer adds. --cprofile prints where the `nn` forward+backward spends its
time (cProfile, sorted by own time). Prints a table; no JSON.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from bench_block import coda_runner, make
from common import CONFIGS

from coda import _C, _kernels
from coda.ops import _block


def per_call_us(fn, calls, batches=5):
    """Median over batches of the CPU time per call of `calls` unsynchronized calls."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append(1e6 * (time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
    return sorted(out)[len(out) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="llama3-1b:8192")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--cprofile", action="store_true")
    args = p.parse_args()
    name, tokens = args.config.split(":")
    cfg = CONFIGS[name]
    d, Fi, hq, hkv, hd = cfg
    w, y0, x0, pos, inv, cos, sin = make(cfg, int(tokens))
    fwd, params = coda_runner(cfg, w, pos, inv)
    gout = None

    def nn_fwd():
        return fwd(y0, x0)

    def nn_fwd_bwd():
        nonlocal gout
        outs = fwd(y0, x0)
        if gout is None:
            gout = [torch.randn_like(o) for o in outs]
        torch.autograd.backward(outs, gout)
        for t in list(params) + [y0, x0]:
            t.grad = None

    wo, g1, wgu, wd, g2, wqkv = (t.detach() for t in params)
    yd, xd = y0.detach(), x0.detach()
    pos32, invf = pos.to(torch.int32), inv.float()
    op_args = (yd, xd, wo, g1, wgu, wd, g2, wqkv, pos32, invf, hq, hkv, hd, 1e-6, None, None, 0.0, True)
    saved = torch.ops.coda.block_forward(*op_args)[:6]  # without the QK-norm's (empty) z
    x1, rstd1, z1, x2, rstd2, qkv = saved
    dqkv = torch.randn_like(qkv)
    z1_keep = z1.clone()

    def op_fwd():
        return torch.ops.coda.block_forward(*op_args)

    def op_bwd():
        z1.copy_(z1_keep)  # the backward overwrites z1 and dqkv; a copy is one more (cheap) launch
        return torch.ops.coda.block_backward(yd, pos32, invf, wo, g1, wgu, wd, g2, wqkv, x1, rstd1, z1, x2, rstd2,
                                             qkv, dqkv, None, hq, hkv, hd, 1e-6, None, None, None, 0.0)

    def k_fwd():
        return _kernels.block_forward(yd, xd, wo, g1, wgu, wd, g2, wqkv, pos32, invf, hq, hkv, hd, 1e-6)

    def k_bwd():
        z1.copy_(z1_keep)
        return _kernels.block_backward(yd, pos32, invf, wo, g1, wgu, wd, g2, wqkv, x1, rstd1, z1, x2, rstd2, qkv,
                                       dqkv, None, hq, hkv, hd, 1e-6)

    dev = x0.device
    cfg_c = _block._block_config(d, Fi, hq, hkv, hd, 1e-6)
    weights_c = _block._block_weights(wo, g1, wgu, wd, g2, wqkv)
    saved_c = _C.tensors(_C.BlockSaved, *saved, None)
    lib = _C.library()
    ws_f = _C.workspace(lib.coda_block_forward_workspace_size(cfg_c, xd.shape[0]), dev)
    ws_b = _C.workspace(lib.coda_block_backward_workspace_size(cfg_c, xd.shape[0]), dev)
    dy0, dx0 = torch.empty_like(yd), torch.empty_like(xd)
    grads = [torch.empty_like(t) for t in (wo, wgu, wd, wqkv)]
    dg1, dg2 = torch.empty(d, device=dev), torch.empty(d, device=dev)
    grads_c = _C.tensors(_C.BlockGrads, grads[0], dg1, grads[1], grads[2], dg2, grads[3], None, None)
    descs = [_C.desc(t) for t in (yd, xd, pos32, invf, dqkv, dy0, dx0)]
    stream = _C.stream(dev)

    def c_fwd():
        _C.call("block_forward", cfg_c, weights_c, descs[0], descs[1], descs[2], descs[3], saved_c,
                ws_f.data_ptr(), ws_f.numel(), stream)

    def c_bwd():
        z1.copy_(z1_keep)
        _C.call("block_backward", cfg_c, weights_c, descs[0], descs[2], descs[3], saved_c, descs[4], None,
                descs[5], descs[6], grads_c, ws_b.data_ptr(), ws_b.numel(), stream)

    # (layer, forward, backward, whether `backward` runs the forward too: autograd needs its graph)
    rows = [("nn (autograd)", nn_fwd, nn_fwd_bwd, True), ("op (custom op)", op_fwd, op_bwd, False),
            ("kernels", k_fwd, k_bwd, False), ("c_abi", c_fwd, c_bwd, False)]
    print(f"host time per call, {args.config}, {args.calls} unsynchronized calls per batch, median of 5 batches")
    print("| layer | forward us | backward us |")
    print("|---|---:|---:|")
    for label, f, b, with_forward in rows:
        tf = per_call_us(f, args.calls)
        tb = per_call_us(b, args.calls) - (tf if with_forward else 0.0)
        print(f"| {label} | {tf:.1f} | {tb:.1f} |")
    if args.cprofile:
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        for _ in range(args.calls):
            nn_fwd_bwd()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
