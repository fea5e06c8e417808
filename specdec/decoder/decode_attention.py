"""Decode attention in Triton, for a step's few query rows on a GPU: one pass over the cache's slots, then a combine.

`model.attention` writes the computation out (scores, mask, softmax, weighted sum) and stays its reference
and its CPU twin. Compiled, that is three kernels a layer (two cuBLAS matmuls and a fused softmax) and reads
every slot of the span. Here, as in flash-decoding, the slots are split among programs; each streams its
keys and values once, keeps a running max and sum per query row (the online softmax), and skips the keys
and values of slots no row may see (past the live prefix); a second small kernel combines the splits.
Shapes as model.attention's: q [B, h, R, D] (R = query rows: a group's heads x new tokens), k, v [B, h, S, D],
mask [B, 1, R, S] bool -> [B, h, R, D].

rope_append_attention does more of model.Attention in the same two kernels, for a chain's step: it takes the
projections before rope and the layer's cache, rotates the new queries and keys, writes the new keys and values
into the cache and attends with each row's positions in place of the mask (model.ROPE_IN_KERNEL).
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
    mask [B, 1, R, S] bool, or [1, 1, R, S] for every row of the batch (as SDPA and model.attention broadcast it)
    -> [B, h, R, D] in q's dtype."""
    B, H, R, D = q.shape
    S = k.shape[2]
    rows, splits, split_slots, parts = _plan(B, H, R, S, D, q.device)
    _split[(B * H, splits)](
        q, k, v, mask, *parts,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        v.stride(0), v.stride(1), v.stride(2), v.stride(3), mask.stride(0) if mask.shape[0] == B else 0,
        mask.stride(2), mask.stride(3),
        H, R, S,
        SCALE=D ** -0.5, SPLIT_SLOTS=split_slots, ROWS=rows, BLOCK_S=BLOCK_S, D=D, IEEE=q.dtype == torch.float32)
    return _combined(parts, B, H, R, D, q.dtype, splits, rows)


def rope_append_attention(qk: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          positions: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, n_slots: int,
                          n_heads: int) -> torch.Tensor:
    """Rope, the cache write and decode attention in the same two kernels (issue 21: rope and the two writes were three
    small kernels a layer): what model.Attention does from its projections on, for a chain's step (no tree view).
    qk [B, T, nh + nkv, D] the queries' and keys' projections before rope, v [B, T, nkv, D], cos, sin [B, 1, T, D],
    positions [B, T], cache_k, cache_v [B, nkv, S_max, D] (the layer's cache, written at the positions) ->
    [B, nkv, g*T, D] (row j*T + t: query head j of the group, token t), as decode_attention's output.

    The step's new keys never make the round trip through memory before they are used: the split that starts at
    slot 0 rotates them, scores them from registers as one more tile and writes them (and their values) into the
    cache; every split leaves the slots the step writes out of its cache tiles. A query at position p sees slots up
    to p, as model.attention_mask says."""
    B, T, HQK, D = qk.shape
    KV = HQK - n_heads
    G = n_heads // KV
    rows, splits, split_slots, parts = _plan(B, KV, G * T, n_slots, D, qk.device)
    _split_rope[(B * KV, splits)](
        qk, v, cos, sin, positions, cache_k, cache_v, *parts,
        qk.stride(0), qk.stride(1), qk.stride(2), qk.stride(3), v.stride(0), v.stride(1), v.stride(2), v.stride(3),
        cos.stride(0), cos.stride(2), cos.stride(3), sin.stride(0), sin.stride(2), sin.stride(3),
        positions.stride(0), positions.stride(1),
        cache_k.stride(0), cache_k.stride(1), cache_k.stride(2), cache_k.stride(3),
        cache_v.stride(0), cache_v.stride(1), cache_v.stride(2), cache_v.stride(3),
        KV, T, n_slots, n_heads,
        G=G, SCALE=D ** -0.5, SPLIT_SLOTS=split_slots, ROWS=rows, NEW=max(16, triton.next_power_of_2(T)),
        BLOCK_S=BLOCK_S, D=D, IEEE=qk.dtype == torch.float32)
    return _combined(parts, B, KV, G * T, D, qk.dtype, splits, rows)


def _plan(B: int, H: int, R: int, S: int, D: int, device) -> tuple[int, int, int, tuple[torch.Tensor, ...]]:
    """How the first pass splits S slots among programs, and where each split leaves its partial result:
    (rows, splits, slots per split, (weighted sums [B*H, splits, rows, D], running maxes and sums [B*H, splits, rows]))."""
    rows = max(16, triton.next_power_of_2(R))  # tl.dot needs 16 rows at least; the padding rows are masked
    tiles = triton.cdiv(S, BLOCK_S)
    splits = min(triton.next_power_of_2(tiles), triton.next_power_of_2(triton.cdiv(PROGRAMS, B * H)))
    acc = torch.empty(B * H, splits, rows, D, device=device, dtype=torch.float32)  # each split's weighted sum
    top = torch.empty(B * H, splits, rows, device=device, dtype=torch.float32)  # its rows' running max
    total = torch.empty_like(top)  # and sum of exp(score - max)
    return rows, splits, triton.cdiv(tiles, splits) * BLOCK_S, (acc, top, total)


def _combined(parts, B: int, H: int, R: int, D: int, dtype, splits: int, rows: int) -> torch.Tensor:
    """The second pass: the splits' partial results -> [B, H, R, D] in dtype."""
    out = torch.empty(B, H, R, D, device=parts[0].device, dtype=dtype)
    _combine[(B * H, R)](*parts, out, out.stride(0), out.stride(1), out.stride(2), H, SPLITS=splits, ROWS=rows, D=D)
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
            vv = tl.load(V + b * svb + h * svh + s[:, None] * svs + d[None, :] * svd, mask=live[:, None], other=0.0)
            m_i, l_i, acc = _online(q, k, vv, seen, m_i, l_i, acc, SCALE, IEEE)
        _store_partial(Acc, Max, Sum, bh * tl.num_programs(1) + split, acc, m_i, l_i, ROWS, D)

    @triton.jit
    def _online(q, k, vv, seen, m_i, l_i, acc, SCALE: tl.constexpr, IEEE: tl.constexpr):
        """One tile of the online softmax: q's scores against the tile's keys k where seen [ROWS, BLOCK_S], folded into
        each row's running max m_i, sum l_i and weighted sum acc of the values vv; returns the three."""
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        scores = tl.where(seen, scores * SCALE, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet: exp(-inf) = 0
        p = tl.exp(scores - base[:, None])
        alpha = tl.exp(m_i - base)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, vv, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
        return m_new, l_i * alpha + tl.sum(p, axis=1), acc

    @triton.jit
    def _store_partial(Acc, Max, Sum, part, acc, m_i, l_i, ROWS: tl.constexpr, D: tl.constexpr):
        """A split's result for the combine: its weighted sums, running maxes and sums."""
        r = tl.arange(0, ROWS)
        tl.store(Acc + (part * ROWS + r[:, None]) * D + tl.arange(0, D)[None, :], acc)
        tl.store(Max + part * ROWS + r, m_i)
        tl.store(Sum + part * ROWS + r, l_i)

    @triton.jit
    def _rotated(QK, COS, SIN, b, t, head, ok, sqb, sqt, sqh, sqd, scb, sct, scd, ssb, sst, ssd, D: tl.constexpr):
        """Rows of QK [b, t, head, :] rotated as model.Attention does (x cos + rotate_half(x) sin), in fp32; t and
        head are row vectors, ok masks the rows that exist."""
        d = tl.arange(0, D)
        partner = (d + D // 2) % D  # rotate_half: the first half takes minus the second, the second the first
        sign = tl.where(d < D // 2, -1.0, 1.0)
        at = QK + b * sqb + t[:, None] * sqt + head[:, None] * sqh
        x = tl.load(at + d[None, :] * sqd, mask=ok[:, None], other=0.0).to(tl.float32)
        y = tl.load(at + partner[None, :] * sqd, mask=ok[:, None], other=0.0).to(tl.float32)
        c = tl.load(COS + b * scb + t[:, None] * sct + d[None, :] * scd, mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.load(SIN + b * ssb + t[:, None] * sst + d[None, :] * ssd, mask=ok[:, None], other=0.0).to(tl.float32)
        return x * c + sign[None, :] * y * s

    @triton.jit
    def _split_rope(QK, V, COS, SIN, POS, CK, CV, Acc, Max, Sum,
                    sqb, sqt, sqh, sqd, svb, svt, svh, svd, scb, sct, scd, ssb, sst, ssd, spb, spt,
                    skb, skh, sks, skd, scvb, scvh, scvs, scvd,
                    H, T, S, NH,
                    G: tl.constexpr, SCALE: tl.constexpr, SPLIT_SLOTS: tl.constexpr, ROWS: tl.constexpr,
                    NEW: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, IEEE: tl.constexpr):
        """_split with rope and the cache write folded in: one (row of the batch, key/value head) x one split."""
        bh, split = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        r = tl.arange(0, ROWS)
        d = tl.arange(0, D)
        real = r < G * T
        t_of = r % T  # row j*T + t: query head h*G + j, token t
        q = _rotated(QK, COS, SIN, b, t_of, h * G + r // T, real, sqb, sqt, sqh, sqd, scb, sct, scd, ssb, sst, ssd, D)
        q = q.to(QK.dtype.element_ty)  # rounded as the written-out path's rotated q
        pos_q = tl.load(POS + b * spb + t_of * spt, mask=real, other=-1)  # [ROWS]: each row's position
        n = tl.arange(0, NEW)
        fresh = n < T
        pos_new = tl.load(POS + b * spb + n * spt, mask=fresh, other=-1)  # [NEW]: the slots this step writes
        m_i = tl.full([ROWS], float("-inf"), tl.float32)
        l_i = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, D], tl.float32)
        if split == 0:  # the new tokens, from registers: rotated keys, their values, written to the cache here
            k_new = _rotated(QK, COS, SIN, b, n, NH + h + 0 * n, fresh, sqb, sqt, sqh, sqd, scb, sct, scd,
                             ssb, sst, ssd, D).to(CK.dtype.element_ty)  # [NEW, D]
            v_new = tl.load(V + b * svb + n[:, None] * svt + h * svh + d[None, :] * svd, mask=fresh[:, None], other=0.0)
            tl.store(CK + b * skb + h * skh + pos_new[:, None] * sks + d[None, :] * skd, k_new, mask=fresh[:, None])
            tl.store(CV + b * scvb + h * scvh + pos_new[:, None] * scvs + d[None, :] * scvd, v_new.to(CV.dtype.element_ty),
                     mask=fresh[:, None])
            seen = real[:, None] & fresh[None, :] & (pos_new[None, :] <= pos_q[:, None])
            m_i, l_i, acc = _online(q, k_new, v_new, seen, m_i, l_i, acc, SCALE, IEEE)
        start = split * SPLIT_SLOTS
        for s0 in range(0, SPLIT_SLOTS, BLOCK_S):
            s = start + s0 + tl.arange(0, BLOCK_S)
            written = tl.max((s[:, None] == pos_new[None, :]).to(tl.int32), axis=1) > 0  # [BLOCK_S]: the new slots
            seen = real[:, None] & (s[None, :] <= pos_q[:, None]) & (s[None, :] < S) & ~written[None, :]
            live = tl.max(seen.to(tl.int32), axis=0) > 0
            k = tl.load(CK + b * skb + h * skh + s[:, None] * sks + d[None, :] * skd, mask=live[:, None], other=0.0)
            vv = tl.load(CV + b * scvb + h * scvh + s[:, None] * scvs + d[None, :] * scvd, mask=live[:, None], other=0.0)
            m_i, l_i, acc = _online(q, k, vv, seen, m_i, l_i, acc, SCALE, IEEE)
        _store_partial(Acc, Max, Sum, bh * tl.num_programs(1) + split, acc, m_i, l_i, ROWS, D)

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
