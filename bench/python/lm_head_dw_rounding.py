"""Why the LM head's weight gradient is accumulated in fp32 across token chunks (CPU, float64 reference).

    python bench/python/lm_head_dw_rounding.py [--tokens 8192 --vocab 2048 --hidden 256 --chunks 4,8,32]

A chunked LM-head backward adds one chunk's dW = dlogits_c^T h_c at a time. CODA keeps the running sum in fp32
(a [V, d] fp32 buffer: 0.98 GiB at llama3-1B) and rounds once; Liger's fused linear cross-entropy adds each chunk
into the bf16 gradient (32 chunks of 256 rows at llama3-1B, 8192 tokens), which needs no extra buffer but rounds
the sum once per chunk. This script measures both against PROTOCOL.md's acceptance rule,
max|x - ref64| <= 2 max|unfused - ref64| + 1e-6, where `unfused` is one bf16 GEMM over all tokens with fp32
accumulation, rounded once. All three use the same bf16 dlogits (softmax - onehot, / tokens) and bf16 h, so the
difference is the accumulation alone.
"""
import argparse

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--chunks", default="4,8,32")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    M, V, d = a.tokens, a.vocab, a.hidden
    h = torch.randn(M, d, dtype=torch.float64).bfloat16()           # normalized activations, scale ~1
    w = (0.02 * torch.randn(V, d, dtype=torch.float64)).bfloat16()  # LM-head weight ~N(0, 0.02)
    t = torch.randint(0, V, (M,))
    logits = (h.float() @ w.float().t()).bfloat16()
    g = torch.softmax(logits.double(), -1)
    g[torch.arange(M), t] -= 1
    dl = (g / M).bfloat16()                                          # mean reduction's dlogits, bf16
    ref = dl.double().t() @ h.double()
    unfused = (dl.float().t() @ h.float()).bfloat16()
    e_unf = (unfused.double() - ref).abs().max().item()
    bound = 2 * e_unf + 1e-6

    def verdict(e):
        return "pass" if e <= bound else "FAIL"
    print(f"tokens {M}, V {V}, d {d}: unfused (one GEMM, fp32 accumulate, one rounding) max err {e_unf:.3e}, "
          f"bound {bound:.3e}")
    print("| chunks | rows per chunk | fp32 running sum, rounded once | ratio | bf16 running sum (rounded per chunk) | ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in (int(c) for c in a.chunks.split(",")):
        rows = M // n
        acc32 = torch.zeros(V, d, dtype=torch.float32)
        acc16 = torch.zeros(V, d, dtype=torch.bfloat16)
        for c in range(0, M, rows):
            part = dl[c:c + rows].float().t() @ h[c:c + rows].float()
            acc32 += part
            acc16 = (acc16.float() + part).bfloat16()
        e32 = (acc32.bfloat16().double() - ref).abs().max().item()
        e16 = (acc16.double() - ref).abs().max().item()
        print(f"| {n} | {rows} | {e32:.3e} ({verdict(e32)}) | {e32 / e_unf:.2f} | {e16:.3e} ({verdict(e16)}) | "
              f"{e16 / e_unf:.2f} |")


if __name__ == "__main__":
    main()
