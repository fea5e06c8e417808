"""The project's own training loop for the zoo: target, draft, then MTP layer + heads + EAGLE head.

The draft modules are trained with the target frozen, by self-distillation: their labels are the
target's own next-token distributions, because acceptance is agreement with the target.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specdec.decoder.bundle import ModelBundle
from specdec.decoder.draft_modules import EagleHead, MTPHeads, MTPLayer, chained_soft_ce, soft_ce
from specdec.decoder.engine import Engine
from specdec.decoder.model import Transformer


def token_stream(tok, docs: list[str], seed: int = 0) -> torch.Tensor:
    """Documents in a seeded order, each followed by EOS, as one long 1-D tensor of ids."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    eos = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for i in order:
        ids.extend(tok.encode(docs[i]).ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def sample_batch(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows [batch, seq_len + 1] of the stream."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([stream[s:s + seq_len + 1] for s in starts.tolist()])


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def autocast(device: str):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@dataclass
class StageLog:
    name: str
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0
    curve: list = field(default_factory=list)  # (step, train_loss, eval_metrics)
    best: dict = field(default_factory=dict)


def _eval_windows(stream: torch.Tensor, seq_len: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return sample_batch(stream, n, seq_len, g)


@torch.no_grad()
def eval_lm(model: Transformer, windows: torch.Tensor, device: str, chunk: int = 16) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), chunk):
        w = windows[i:i + chunk].to(device)
        with autocast(device):
            logits, _ = model(w[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


def train_lm(model: Transformer, batches, heldout: torch.Tensor, stage, device: str,
             name: str, seed: int = 0, progress: bool = True, teacher: Transformer | None = None) -> StageLog:
    """Next-token training with AdamW and a cosine schedule; keeps the best held-out weights.

    `batches(n)` gives training windows [n, seq_len + 1]. With a `teacher`, the labels are the
    teacher's distributions (distillation: a draft learns to agree with its target)."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.1)
    windows = _eval_windows(heldout, stage.seq_len, 64, seed + 7)
    log, t0 = StageLog(name), time.time()
    best_loss, best_state = float("inf"), None
    bar = tqdm(range(stage.steps), desc=f"train {name}", disable=not progress, mininterval=2)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, stage.steps, stage.lr)
        x = batches(stage.batch).to(device)
        with autocast(device):
            logits, _ = model(x[:, :-1])
            if teacher is not None:
                with torch.no_grad():
                    t_logits, _ = teacher(x[:, :-1])
        if teacher is None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        else:
            loss = soft_ce(logits, t_logits.float().softmax(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % stage.eval_every == 0 or step + 1 == stage.steps:
            ev = eval_lm(model, windows, device)
            log.curve.append((step + 1, round(loss.item(), 4), {"heldout_loss": round(ev, 4)}))
            bar.set_postfix(loss=f"{loss.item():.3f}", heldout=f"{ev:.3f}")
            if ev < best_loss:
                best_loss, best_state = ev, {k: v.detach().clone() for k, v in model.state_dict().items()}
                log.best = {"step": step + 1, "heldout_loss": round(ev, 4), "heldout_ppl": round(math.exp(ev), 3)}
    model.load_state_dict(best_state)
    model.eval()
    log.steps, log.seconds, log.tokens = stage.steps, round(time.time() - t0, 1), stage.steps * stage.batch * stage.seq_len
    return log


class DepthKV:
    """The MTP layer's KV cache as unrolled training fills it (kv_cache.LayerCache's write and read): the keys
    and values of every depth side by side (depth d's entry for position p in slot (d - 1) * T + p), appended,
    never written in place, so autograd can follow them. `depth_mask` says which slots a query of each depth reads."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        self.k = k if self.k is None else torch.cat((self.k, k), 2)
        self.v = v if self.v is None else torch.cat((self.v, v), 2)

    def read(self, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, :, :n_slots], self.v[:, :, :n_slots]


def depth_mask(T: int, depth: int, group: int, device) -> torch.Tensor:
    """Which slots the depth-`depth` query at position p reads, as at decode time: the chain started
    at anchor a = p - depth + 1 sees depth-1 entries (target hidden states) at positions <= a, and its
    own depth-j entry at position a + j - 1 for j = 2..depth. [1, 1, group*T, depth*T] bool, in the
    row order of the attention's grouped query heads."""
    p = torch.arange(T, device=device).view(T, 1)
    s = torch.arange(T, device=device).view(1, T)
    blocks = [s <= p - depth + 1] + [s == p - depth + j for j in range(2, depth + 1)]
    return torch.cat(blocks, 1).repeat(group, 1).view(1, 1, group * T, depth * T)


def mtp_unrolled(mtp: MTPLayer, hidden: torch.Tensor, next_ids: torch.Tensor, embed: torch.nn.Embedding,
                 depths: int) -> list[torch.Tensor]:
    """The MTP layer chained `depths` times over every position at once: states g^1..g^D [B, T, H].

    g^d at position p is the d-th draft step of the chain anchored at a = p - d + 1: it reads
    g^{d-1} at p - 1 (g^0 = the target's hidden state at p) and the token x_{p+1} = next_ids[:, p],
    and its logits predict x_{p+2}. Positions p < d - 1 have no anchor and are to be ignored."""
    B, T = next_ids.shape
    pos = torch.arange(T, device=next_ids.device).expand(B, T)
    emb = embed(next_ids)
    cfg = mtp.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    kv, states, rotary = DepthKV(), [], None
    # Step d reads the verified token x_{p+1}, not the chain's own guess: a draft after a wrong one is
    # thrown away, so only chains whose earlier drafts were right (and equal these tokens) ever count.
    for d in range(1, depths + 1):
        x = mtp.combine(emb, hidden, pos)
        rotary = rotary or mtp.rotary(pos, x.dtype)
        g = mtp.finish(mtp.block(x, *rotary, kv, pos, depth_mask(T, d, group, next_ids.device)))
        states.append(g)
        hidden = F.pad(g[:, :-1], (0, 0, 1, 0))  # the next depth at p reads this one at p - 1
    return states


@torch.no_grad()
def chain_acceptance(target, mtp, rows: torch.Tensor, first: int, depths: int, device: str) -> list[float]:
    """On rows the target wrote greedily from column `first` on: the fraction of anchors whose drafts
    1..d all equal the target's greedy tokens, d = 1..depths (greedy decoding's acceptance by
    position, taken over every anchor instead of the anchors a decode happens to visit)."""
    mtp.eval()
    hits = torch.zeros(depths)
    count = 0
    for i in range(0, len(rows), 16):
        ids = rows[i:i + 16].to(device)
        T = ids.shape[1] - 1
        anchors = torch.arange(first, T - depths, device=ids.device)  # x_{a+1} and every answer are the target's
        ok = torch.ones(len(ids), len(anchors), dtype=torch.bool, device=ids.device)
        with autocast(device):
            t_logits, h = target(ids)
            greedy = t_logits.argmax(-1)  # greedy[:, p] is the target's choice for x_{p+1}
            states = mtp_unrolled(mtp, h[:, :-1], ids[:, 1:], target.embed_tokens, depths)
            for d, g in enumerate(states, 1):  # step d of the chain at anchor a sits at position a + d - 1
                ok &= target.lm_head(g[:, anchors + d - 1]).argmax(-1) == greedy[:, anchors + d]
                hits[d - 1] += ok.sum().item()
        count += ok.numel()
    return [round(x / count, 4) for x in hits.tolist()]


def draft_losses(target: Transformer, mtp: MTPLayer, heads: MTPHeads | None, eagle: EagleHead | None,
                 x: torch.Tensor, mtp_weights: tuple[float, ...] = (1.0,)):
    """Losses and top-1 agreement with the target for the draft modules on one batch x [B, T+1].

    Position t (0-based) holds h_t; the target's logits at t predict x_{t+1}.
      MTP layer and EAGLE at t read (h_t, x_{t+1}) and should predict what the target predicts at t+1;
      the MTP layer is unrolled over len(mtp_weights) draft steps (see mtp_unrolled), the loss of
      step d weighted by mtp_weights[d - 1]; agreement "mtp" is step 1's, "mtp{d}" step d's.
      Parallel head i at t reads h_t and should predict what the target predicts at t+i.
    """
    ids = x[:, :-1]
    B, T = ids.shape
    with torch.no_grad():
        t_logits, h = target(ids)  # [B, T, V], [B, T, H]
    pos = torch.arange(T - 1, device=ids.device).expand(B, T - 1)
    out: dict[str, torch.Tensor] = {}
    agree: dict[str, float] = {}
    probs = t_logits.float().softmax(-1)  # once: every module's loss reads a slice of it
    teacher = probs[:, 1:]  # predicts x_{t+2} for t = 0..T-2
    greedy = t_logits[:, 1:].argmax(-1)
    # MTP layer (MiMo): token x_{t+1} embedded and normed, hidden normed, projected; chained.
    states = mtp_unrolled(mtp, h[:, :-1], ids[:, 1:], target.embed_tokens, len(mtp_weights))
    depth_logits = [target.lm_head(g) for g in states]  # [B, T-1, V] per step
    out["mtp"] = chained_soft_ce(depth_logits, teacher, mtp_weights)
    for d, m_logits in enumerate(depth_logits, 1):  # step d has an anchor from position d - 1 on
        agree["mtp" if d == 1 else f"mtp{d}"] = (m_logits[:, d - 1:].argmax(-1) == greedy[:, d - 1:]).float().mean().item()
    if eagle is not None:  # EAGLE: regress the next hidden state, and match the target's distribution.
        e = eagle(h[:, :-1], ids[:, 1:], pos, target.embed_tokens)
        e_logits = target.lm_head(e)
        out["eagle"] = F.smooth_l1_loss(e.float(), h[:, 1:].float()) + 0.5 * soft_ce(e_logits, teacher)
        agree["eagle"] = (e_logits.argmax(-1) == greedy).float().mean().item()
    if heads is not None:  # Parallel heads: head i (1-based) at t predicts what the target predicts at t + i.
        states = heads(h)  # [B, T, k, H]
        head_losses = []
        for i in range(1, heads.num_heads + 1):
            logits_i = target.lm_head(states[:, : T - i, i - 1])
            head_losses.append(soft_ce(logits_i, probs[:, i:]))
            agree[f"head{i}"] = (logits_i.argmax(-1) == t_logits[:, i:].argmax(-1)).float().mean().item()
        out["heads"] = torch.stack(head_losses).mean()
    return out, agree


def train_draft_modules(target: Transformer, mtp: MTPLayer, heads: MTPHeads | None, eagle: EagleHead | None,
                        batches, heldout: torch.Tensor, stage, device: str, seed: int = 0,
                        progress: bool = True, mtp_weights: tuple[float, ...] = (1.0,)) -> StageLog:
    """Train the MTP layer (unrolled over len(mtp_weights) steps) and, when given, the parallel heads
    and the EAGLE head together, target frozen; keeps the weights with the best held-out agreement."""
    target.to(device).eval().requires_grad_(False)
    modules = [m.to(device).train() for m in (mtp, heads, eagle) if m is not None]
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.0)
    windows = _eval_windows(heldout, stage.seq_len, 32, seed + 11)
    name = "+".join(n for n, m in (("mtp", mtp), ("heads", heads), ("eagle", eagle)) if m is not None)
    log, t0 = StageLog(name), time.time()
    best_score, best_states = -1.0, None
    bar = tqdm(range(stage.steps), desc=f"train {name}", disable=not progress, mininterval=2)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, stage.steps, stage.lr)
        x = batches(stage.batch).to(device)
        with autocast(device):
            losses, _ = draft_losses(target, mtp, heads, eagle, x, mtp_weights)
        loss = sum(losses.values())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if (step + 1) % stage.eval_every == 0 or step + 1 == stage.steps:
            for m in modules:
                m.eval()
            with torch.no_grad(), autocast(device):
                agrees = [draft_losses(target, mtp, heads, eagle, windows[i:i + 8].to(device), mtp_weights)[1]
                          for i in range(0, len(windows), 8)]
            for m in modules:
                m.train()
            ev = {k: round(sum(a[k] for a in agrees) / len(agrees), 4) for k in agrees[0]}
            log.curve.append((step + 1, round(loss.item(), 4), ev))
            bar.set_postfix(loss=f"{loss.item():.3f}", **{k: ev[k] for k in ("mtp", "head1", "eagle") if k in ev})
            score = sum(ev.values())
            if score > best_score:
                best_score = score
                best_states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]
                log.best = {"step": step + 1, "heldout_top1_agreement": ev}
    for m, s in zip(modules, best_states):
        m.load_state_dict(s)
        m.eval()
    log.steps, log.seconds, log.tokens = stage.steps, round(time.time() - t0, 1), stage.steps * stage.batch * stage.seq_len
    return log


@torch.no_grad()
def generate_self_data(target: Transformer, stream: torch.Tensor, n_seqs: int, prompt_len: int, new_tokens: int,
                       batch: int, device: str, seed: int = 0, progress: bool = True) -> torch.Tensor:
    """The target's own greedy continuations of corpus windows: [n_seqs, prompt_len + new_tokens].

    Drafts are judged by agreement with the target's greedy output, so they learn most from text
    the target itself writes (self-distillation in the Medusa-2 sense)."""

    target.to(device).eval()
    bundle = ModelBundle(name="self-distillation", target=target, tokenizer=None)
    dec = Engine(bundle, "ar", max_batch=batch, max_len=prompt_len + new_tokens + 4)
    gen = torch.Generator().manual_seed(seed + 3)
    out = []
    for _ in tqdm(range(0, n_seqs, batch), desc="generate self-distillation data", disable=not progress):
        prompts = sample_batch(stream, batch, prompt_len - 1, gen)
        r = dec.generate(prompts.tolist(), max_new_tokens=new_tokens, stop_at_eos=False)
        out.append(torch.cat([prompts, torch.tensor(r.tokens)], 1))
    return torch.cat(out)[:n_seqs].cpu()


class MixedBatches:
    """Windows [batch, seq_len + 1]: a fraction from the corpus, the rest from generated rows."""

    def __init__(self, stream: torch.Tensor, generated: torch.Tensor | None, seq_len: int,
                 generated_fraction: float, seed: int):
        self.stream, self.generated, self.seq_len = stream, generated, seq_len
        self.frac = generated_fraction if generated is not None else 0.0
        self.gen = torch.Generator().manual_seed(seed)
        if generated is not None and generated.shape[1] < seq_len + 1:
            raise ValueError("generated rows are shorter than a training window")

    def __call__(self, batch: int) -> torch.Tensor:
        n_gen = int(round(batch * self.frac))
        parts = [sample_batch(self.stream, batch - n_gen, self.seq_len, self.gen)] if batch > n_gen else []
        if n_gen:
            rows = torch.randint(0, len(self.generated), (n_gen,), generator=self.gen)
            start = torch.randint(0, self.generated.shape[1] - self.seq_len, (1,), generator=self.gen).item()
            parts.append(self.generated[rows, start:start + self.seq_len + 1])
        return torch.cat(parts)
