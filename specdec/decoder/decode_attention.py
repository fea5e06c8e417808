"""Decode attention in Triton, for a step's few query rows on a GPU: one pass over the cache's slots, then a combine.

`model.attention` writes the computation out (scores, mask, softmax, weighted sum) and stays its reference
and its CPU twin. Compiled, that is three kernels a layer (two cuBLAS matmuls and a fused softmax) and reads
every slot of the span. Here, as in flash-decoding, the slots are split among programs; each streams its
keys and values once, keeps a running max and sum per query row (the online softmax), and skips the keys
and values of slots no row may see (past the live prefix); a second small kernel combines the splits.
Shapes as model.attention's: q [B, h, R, D] (R = query rows: a group's heads x new tokens), k, v [B, h, S, D],
mask [B, 1, R, S] bool -> [B, h, R, D].
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU install has no Triton: model.attention runs instead
    triton = None

BLOCK_S = 64  # slots per tile
# rows of the batch up to which the kernel runs: on an H200 it is faster at 1, ties at 8 and is slower at 64 than the
# compiled written-out attention (docs/results.md, "Decode attention: FlexAttention and a Triton kernel")
MAX_BATCH = 8
PROGRAMS = 1024  # programs to aim for (an H200 has 132 SMs): enough splits to fill the GPU at batch 1, two at 64


def fits(q: torch.Tensor) -> bool:
    """Whether the kernel computes this step's attention (else model.attention does): CUDA and Triton, a head
    dimension that is a power of two of at least 16 (tl.dot's and tl.arange's needs), 16- or 32-bit floats, a batch
    of at most MAX_BATCH rows."""
    D = q.shape[-1]
    return (triton is not None and q.is_cuda and D >= 16 and D & (D - 1) == 0 and q.shape[0] <= MAX_BATCH
            and q.dtype in (torch.float16, torch.bfloat16, torch.float32))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v over the slots the mask allows, in two kernels: q [B, h, R, D], k, v [B, h, S, D],
    mask [B, 1, R, S] bool -> [B, h, R, D] in q's dtype."""
    B, H, R, D = q.shape
    S = k.shape[2]
    rows = max(16, triton.next_power_of_2(R))  # tl.dot needs 16 rows at least; the padding rows are masked
    tiles = triton.cdiv(S, BLOCK_S)
    splits = min(triton.next_power_of_2(tiles), triton.next_power_of_2(triton.cdiv(PROGRAMS, B * H)))
    split_slots = triton.cdiv(tiles, splits) * BLOCK_S
    acc = torch.empty(B * H, splits, rows, D, device=q.device, dtype=torch.float32)  # each split's weighted sum
    top = torch.empty(B * H, splits, rows, device=q.device, dtype=torch.float32)  # its rows' running max
    total = torch.empty_like(top)  # and sum of exp(score - max)
    _split[(B * H, splits)](
        q, k, v, mask, acc, top, total,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3), mask.stride(0), mask.stride(2), mask.stride(3),
        H, R, S,
        SCALE=D ** -0.5, SPLIT_SLOTS=split_slots, ROWS=rows, BLOCK_S=BLOCK_S, D=D, IEEE=q.dtype == torch.float32)
    out = torch.empty(B, H, R, D, device=q.device, dtype=q.dtype)
    _combine[(B * H, R)](acc, top, total, out, out.stride(0), out.stride(1), out.stride(2), H,
                         SPLITS=splits, ROWS=rows, D=D)
    return out


if triton is not None:

    @triton.jit
    def _split(Q, K, V, Keep, Acc, Max, Sum,
               sqb, sqh, sqr, sqd, skb, skh, sks, skd, svb, svh, svs, svd, smb, smr, sms,
               H, R, S,
               SCALE: tl.constexpr, SPLIT_SLOTS: tl.constexpr, ROWS: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr,
               IEEE: tl.constexpr):
        """One (row of the batch, key/value head) x one split of the slots: its partial softmax-weighted sum."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        r = tl.arange(0, ROWS)
        d = tl.arange(0, D)
        q = tl.load(Q + b * sqb + h * sqh + r[:, None] * sqr + d[None, :] * sqd, mask=r[:, None] < R, other=0.0)
        m_i = tl.full([ROWS], float("-inf"), tl.float32)  # running max of each row's scores
        l_i = tl.zeros([ROWS], tl.float32)  # running sum of exp(score - max)
        acc = tl.zeros([ROWS, D], tl.float32)
        start = split * SPLIT_SLOTS
        for s0 in range(0, SPLIT_SLOTS, BLOCK_S):
            s = start + s0 + tl.arange(0, BLOCK_S)
            seen = tl.load(Keep + b * smb + r[:, None] * smr + s[None, :] * sms,
                           mask=(r[:, None] < R) & (s[None, :] < S), other=0) != 0  # [ROWS, BLOCK_S]
            live = tl.max(seen.to(tl.int32), axis=0) > 0  # [BLOCK_S]: a slot some row sees; the rest are not read
            k = tl.load(K + b * skb + h * skh + s[:, None] * sks + d[None, :] * skd, mask=live[:, None], other=0.0)
            if IEEE:
                scores = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(k))
            scores = tl.where(seen, scores * SCALE, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet: exp(-inf) = 0
            p = tl.exp(scores - base[:, None])
            alpha = tl.exp(m_i - base)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vv = tl.load(V + b * svb + h * svh + s[:, None] * svs + d[None, :] * svd, mask=live[:, None], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, vv, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
            m_i = m_new
        part = bh * tl.num_programs(1) + split
        tl.store(Acc + (part * ROWS + r[:, None]) * D + d[None, :], acc)
        tl.store(Max + part * ROWS + r, m_i)
        tl.store(Sum + part * ROWS + r, l_i)

    @triton.jit
    def _combine(Acc, Max, Sum, Out, sob, soh, sor, H,
                 SPLITS: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr):
        """One (row of the batch, key/value head, query row): the splits' sums rescaled to one max, added, normalised."""
        bh, r = tl.program_id(0), tl.program_id(1)
        sp = tl.arange(0, SPLITS)
        d = tl.arange(0, D)
        at = (bh * SPLITS + sp) * ROWS + r  # [SPLITS]
        m = tl.load(Max + at)
        top = tl.max(m, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(m - top)  # a split that saw nothing weighs 0
        acc = tl.load(Acc + at[:, None] * D + d[None, :])  # [SPLITS, D]
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * tl.load(Sum + at), axis=0)
        b, h = bh // H, bh % H
        tl.store(Out + b * sob + h * soh + r * sor + d, out.to(Out.dtype.element_ty))
