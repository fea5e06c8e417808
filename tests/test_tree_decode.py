"""Lab 2's draft trees (specdec.decoder.tree, step.tree_verify): the tree mask against a brute force, the
greedy walk against a walk written out, the multi-candidate rule against Lab 1's numpy reference, and on the
tiny zoo: greedy tree decoding equals plain decoding for every tree shape, topk 1 is the chain, and a tree
accepts at least as much as the chain of the same depth."""

import numpy as np
import pytest
import torch
from quick import later

from specdec.decoder import verify as torch_rules
from specdec.decoder.engine import Engine
from specdec.decoder.tree import TreeShape, grow, path_nodes, ancestors, tree_mask
from specdec.sim import verify as reference

N = 40  # new tokens per prompt


def random_parents(rng, B, n):
    """Trees of n nodes per row, the root as node 0 (parent -1), every parent before its child."""
    return torch.tensor([[-1] + [int(rng.integers(0, i)) for i in range(1, n)] for _ in range(B)])


@pytest.mark.parametrize("seed", range(4))
def test_tree_mask_is_the_brute_force_mask(seed):
    rng = np.random.default_rng(seed)
    B, n, span = 3, 7, 20
    parents, lengths = random_parents(rng, B, n), torch.tensor([0, 5, 13])
    want = torch.zeros(B, n, span, dtype=torch.bool)
    for b in range(B):
        for i in range(n):
            want[b, i, : lengths[b]] = True  # the committed prefix
            node = i
            while node >= 0:  # itself and its ancestors, each at slot lengths + its index
                want[b, i, lengths[b] + node] = True
                node = int(parents[b, node])
    assert torch.equal(tree_mask(lengths, parents, span), want)


def test_a_chain_s_tree_mask_is_the_causal_mask():
    lengths, k = torch.tensor([3, 6]), 4
    chain = torch.arange(-1, k).expand(2, k + 1)  # node i's parent is i - 1
    pos = lengths.unsqueeze(1) + torch.arange(k + 1)
    assert torch.equal(tree_mask(lengths, chain, 12), torch.arange(12).view(1, 1, -1) <= pos.unsqueeze(-1))


@pytest.mark.parametrize("seed", range(4))
def test_the_greedy_walk_is_the_walk_written_out(seed):
    rng = np.random.default_rng(seed)
    B, n, V, depth = 64, 9, 9, 8
    parents = random_parents(rng, B, n)
    depths = torch.zeros(B, n, dtype=torch.long)
    for i in range(1, n):
        depths[:, i] = depths.gather(1, parents[:, i : i + 1].clamp(min=0))[:, 0] + 1
    tokens, target = torch.zeros(B, n, dtype=torch.long), torch.tensor(rng.integers(0, V, (B, n)))
    for b in range(B):
        for node in range(n):
            kids = [c for c in range(n) if parents[b, c] == node]
            tokens[b, kids] = torch.tensor(rng.permutation(V)[: len(kids)], dtype=torch.long)  # siblings differ
            if kids and rng.random() < 0.7:  # the target agrees with one of them: walks go deep
                target[b, node] = tokens[b, kids[rng.integers(len(kids))]]
    logits = torch.nn.functional.one_hot(target, V) * 3.0 + torch.tensor(rng.normal(size=(B, n, V)))
    accepted, last, next_token = torch_rules.tree_greedy_accept(tokens, parents, depths, depth, logits)
    # the verify's form, the walk read off the ancestor rows at once: the same walk
    with_anc = torch_rules.tree_greedy_accept(tokens, parents, depths, depth, logits, ancestors(parents))
    assert all(torch.equal(a, b) for a, b in zip((accepted, last, next_token), with_anc))
    best = logits.argmax(-1)
    for b in range(B):
        node = 0
        while True:  # the first child (by index) that equals the target's argmax at its parent
            kids = [c for c in range(n) if parents[b, c] == node and tokens[b, c] == best[b, node]]
            if not kids:
                break
            node = kids[0]
        assert (int(last[b]), int(accepted[b]), int(next_token[b])) == (node, int(depths[b, node]), int(best[b, node]))
        path = path_nodes(ancestors(parents), depths, last, depth)[b, : int(accepted[b]) + 1].tolist()
        assert path[-1] == node and all(parents[b, c] == p for p, c in zip(path, path[1:])) and path[0] == 0


@pytest.mark.parametrize("dense", [False, True])
def test_several_candidates_are_lab1_multi_draft_verify(dense):
    """Given the same uniforms, the torch rule accepts the same candidate and leaves the same residual as the
    numpy reference: deterministic top-k candidates (q one-hot on each) and sampled ones (a q per candidate)."""
    rng = np.random.default_rng(3 + dense)
    n, m, V = 3000, 3, 6
    p = rng.dirichlet(np.ones(V) * 0.5, size=n)
    if dense:
        q = rng.dirichlet(np.ones(V), size=(n, m))
        cand = reference.sample_categorical(q, rng)
    else:
        cand = np.stack([rng.permutation(V)[:m] for _ in range(n)])  # distinct, as a node's top-k children
        q = np.eye(V)[cand]
    u = rng.random((n, m))
    want_index, want_r = reference.multi_draft_verify_batch(p, q, cand, u)
    index, r = torch_rules.candidates_accept(torch.tensor(p), torch.tensor(q) if dense else None, torch.tensor(cand),
                                             torch.ones(n, m, dtype=torch.bool), torch.tensor(u))
    assert np.array_equal(index.numpy(), want_index)
    assert np.allclose(r.numpy(), want_r, atol=1e-12)
    assert 0 < (want_index < 0).mean() < 0.9  # every branch was taken


def test_tree_accept_is_lab1_s_rule_level_by_level():
    """The sampled walk against the numpy reference applied node by node with the same uniforms: the children of
    the current node are the candidates (q one-hot on each), the accepted one is the next node, else the token is
    drawn from what r became (p at a node without children: the bonus)."""
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    B, V, shape = 300, 5, TreeShape.make(3, 2, 6)
    tree = grow(torch.randn(B, V) * 2, torch.zeros(B, 1, 1), shape,
                lambda depth, states, tokens, fed: (states, torch.randn(B, tokens.shape[1], V) * 2))
    tokens, parents, depths = tree.block(torch.zeros(B, dtype=torch.long))
    N, K, D = tokens.shape[1], shape.topk, shape.num_steps
    p = rng.dirichlet(np.ones(V) * 0.7, size=(B, N))
    u = rng.random((B, D * K + 1))
    accepted, last, next_token = torch_rules.tree_accept(tokens, parents, depths, D, K, torch.tensor(p),
                                                         torch.tensor(u))
    for b in range(B):
        node, dist = 0, None
        for level in range(D):
            kids = [c for c in range(N) if parents[b, c] == node]
            if not kids:
                break
            cand = tokens[b, kids].numpy()
            index, r = reference.multi_draft_verify_batch(p[b, node], np.eye(V)[cand][None], cand[None],
                                                          u[b, level * K : level * K + len(kids)][None])
            if index[0] < 0:
                dist = r[0]
                break
            node = kids[index[0]]
        dist = p[b, node] if dist is None else dist
        want = torch_rules.sample(torch.tensor(dist), torch.tensor(u[b, -1]))
        assert (int(last[b]), int(accepted[b]), int(next_token[b])) == (node, int(depths[b, node]), int(want))
    assert 0 < (accepted == 0).float().mean() < 1 and (accepted == D).any()  # rejections, and full-depth walks


def test_grow_reranks_and_keeps_every_parent():
    torch.manual_seed(0)
    B, V, H = 5, 11, 4
    shape = TreeShape.make(4, 3, 12)
    fed = []

    def forward(depth, states, tokens, seen):  # a drafter with random opinions
        fed.append((depth, tokens.shape, seen.shape))
        return states + 1, torch.randn(B, tokens.shape[1], V) * 3

    tree = grow(torch.randn(B, V) * 3, torch.zeros(B, 1, H), shape, forward)
    assert [f[0] for f in fed] == [1, 2, 3] and fed[-1][2] == (B, 3, 9)  # num_steps - 1 draft passes, topk fed each
    assert tree.tokens.shape == (B, 11)
    for b in range(B):
        for i in range(11):
            p = int(tree.parents[b, i])
            assert -1 <= p < i
            assert tree.depths[b, i] == (1 if p < 0 else tree.depths[b, p] + 1)
            assert tree.scores[b, i] <= (0 if p < 0 else tree.scores[b, p])
        kids = {}
        for i in range(11):
            kids.setdefault(int(tree.parents[b, i]), []).append(int(tree.tokens[b, i]))
        assert all(len(set(k)) == len(k) <= 3 for k in kids.values())  # siblings differ, at most topk
    # topk 1: the chain of argmaxes
    chain = grow(torch.randn(B, V), torch.zeros(B, 1, H), TreeShape.make(3), forward)
    assert chain.parents.tolist() == [[-1, 0, 1]] * B and chain.depths.tolist() == [[1, 2, 3]] * B


def test_grow_hands_each_fed_node_exactly_its_ancestors():
    """What the drafter is told each fed node sees (grow's `seen`, built one gather a depth) equals the ancestors
    walked from the fed nodes' parents. The drafter here names each child after its parent (token 1 + parent x K
    + rank), so the test reads every fed node's parent off its token."""
    torch.manual_seed(1)
    B, H, (steps, K) = 4, 2, (5, 3)
    ROOT = 1 + steps * K * K  # the root's children: ROOT + rank
    V = ROOT + K
    parents, told = [], []

    def forward(depth, states, tokens, seen):
        first = (depth - 1) * K  # the fed index of tokens[:, 0]
        parents.append(torch.where(tokens >= ROOT, -1, (tokens - 1) // K))  # [B, K] fed index of each one's parent
        told.append(seen)
        logits = torch.full((B, K, V), -1e9)
        for i in range(K):
            logits[:, i, 1 + (first + i) * K + torch.arange(K)] = torch.rand(B, K) * 4  # K children of fed node i
        return states, logits

    root = torch.full((B, V), -1e9)
    root[:, ROOT:] = torch.rand(B, K)
    grow(root, torch.zeros(B, 1, H), TreeShape.make(steps, K, 10), forward)
    fed_parents = torch.cat(parents, 1)  # [B, M]
    want = ancestors(fed_parents)
    assert len(told) == steps - 1
    for d, seen in enumerate(told, 1):  # [B, K, F]: every fed node's column, the depths not yet fed seen by none
        assert seen.shape == (B, K, (steps - 1) * K) and not seen[:, :, d * K:].any(), d
        assert torch.equal(seen[:, :, : d * K], want[:, (d - 1) * K: d * K, : d * K]), d
    assert (fed_parents[:, K:] % K != torch.arange(K).repeat(steps - 2)).any()  # beams did mix: not K lone chains


def test_invalid_shapes_are_one_line_errors(tiny_bundle):
    for kw, says in ((dict(topk=0), "topk"), (dict(topk=1, num_draft_tokens=3), "chain"),
                     (dict(topk=2, num_draft_tokens=99), "every node"), (dict(topk=2, num_draft_tokens=1), ">= 2")):
        with pytest.raises(ValueError, match=says):
            TreeShape.make(4, **kw)
    for method in ("draft", "ngram"):
        with pytest.raises(ValueError, match="drafts a chain"):
            Engine(tiny_bundle, method, k=3, topk=2, cuda_graphs="off")


@pytest.fixture(scope="module")
def plain(engine, code_prompts):
    return engine("ar").generate(code_prompts, max_new_tokens=N)


@pytest.mark.parametrize("method", ["eagle", "mtp", "heads"])
@pytest.mark.parametrize("num_steps,topk,num_draft_tokens",  # the narrowest and the widest in the edit loop
                         [(3, 2, 6), (5, 4, 16), *later((4, 2, 5), (4, 4, 8), (2, 4, 11))])
def test_greedy_tree_equals_plain(tiny_bundle, plain, code_prompts, method, num_steps, topk, num_draft_tokens):
    if method == "heads" and num_steps > tiny_bundle.heads.num_heads:
        pytest.skip(f"the zoo has {tiny_bundle.heads.num_heads} heads")
    eng = Engine(tiny_bundle, method, k=num_steps, topk=topk, num_draft_tokens=num_draft_tokens, cuda_graphs="off")
    res = eng.generate(code_prompts, max_new_tokens=N)
    assert res.tokens == plain.tokens
    assert 1.0 <= res.stats.tau <= num_steps + 1 and res.steps < plain.steps


@pytest.mark.parametrize("method,num_steps,topk,num_draft_tokens",
                         [("eagle", 4, 4, 8), ("mtp", 3, 2, 6), ("heads", 4, 2, 5),
                          *later(("eagle", 2, 4, 11), ("mtp", 5, 4, 16), ("heads", 3, 8, 16))])
def test_under_graphs_a_tree_is_captured_and_equals_plain(tiny_bundle, plain, code_prompts, method, num_steps, topk,
                                                          num_draft_tokens):
    """The emulated graphs (the CPU twin of CUDA graphs, which also refuses a host sync inside a capture): the
    drafter's tree and the tree's verify replay their captures, over span buckets of 16.. slots; greedy output
    is plain decoding's."""
    if num_steps > tiny_bundle.heads.num_heads and method == "heads":
        pytest.skip(f"the zoo has {tiny_bundle.heads.num_heads} heads")
    eng = Engine(tiny_bundle, method, k=num_steps, topk=topk, num_draft_tokens=num_draft_tokens,
                 cuda_graphs="emulate", min_span=16)
    res = eng.generate(code_prompts, max_new_tokens=N)
    assert res.tokens == plain.tokens and res.steps < plain.steps
    names = {name for name, *_ in eng.graphs.captured} | {name for name, *_ in eng.proposer.graphs.captured}
    assert {"tree", f"tree {num_steps}/{topk}/{num_draft_tokens}"} <= names, names  # nothing ran eagerly
    assert len({span for name, span, *_ in eng.graphs.captured if name == "tree"}) >= 2  # a run crossing buckets


@pytest.mark.parametrize("method", ["mtp", *later("eagle", "heads")])
def test_graphed_trees_stay_valid_as_rows_come_and_go(tiny_bundle, code_prompts, method):
    """Continuous batching under emulated graphs: rows of different lengths join every other step into reused
    slots and leave when done (widths 1, 2, 4), each request's tokens those of decoding it alone, plainly."""
    from test_cuda_graphs import join_and_leave

    alone = join_and_leave(Engine(tiny_bundle, "ar", max_batch=3, cuda_graphs="off"), code_prompts)
    eng = Engine(tiny_bundle, method, k=3, topk=4, num_draft_tokens=8, max_batch=3, cuda_graphs="emulate",
                 min_span=16)
    assert join_and_leave(eng, code_prompts) == alone
    assert {rows for name, _, rows, _ in eng.graphs.captured if name == "tree"} == {1, 2, 3}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; the emulated-graph tests above are its CPU twin")
def test_cuda_graphed_trees_equal_plain_decoding_on_gpu(code_prompts):
    """fp32 on the GPU: trees drafted and verified in real CUDA graphs (captures per width and span bucket) give
    plain decoding's greedy tokens, the whole batch and with rows joining and leaving; sampled rows run too."""
    from test_cuda_graphs import join_and_leave

    from specdec.zoo import load_bundle

    bundle = load_bundle("tiny", device="cuda", dtype=torch.float32)
    plain = Engine(bundle, "ar", cuda_graphs="off").generate(code_prompts, max_new_tokens=N).tokens
    alone = join_and_leave(Engine(bundle, "ar", max_batch=3, cuda_graphs="off"), code_prompts)
    for method, (s, k, n) in (("eagle", (4, 4, 8)), ("eagle", (5, 8, 16)), ("mtp", (3, 2, 6)), ("heads", (3, 4, 8))):
        eng = Engine(bundle, method, k=s, topk=k, num_draft_tokens=n, cuda_graphs="on", min_span=16)
        assert eng.generate(code_prompts, max_new_tokens=N).tokens == plain, (method, s, k, n)
        assert any(name == "tree" for name, *_ in eng.graphs.captured)
        rows = Engine(bundle, method, k=s, topk=k, num_draft_tokens=n, max_batch=3, cuda_graphs="on", min_span=16)
        assert join_and_leave(rows, code_prompts) == alone, (method, s, k, n)
        sampled = eng.generate(code_prompts, max_new_tokens=N, temperature=0.8, seed=1)
        assert all(1 <= len(t) <= N for t in sampled.tokens)
        assert "tree/sample" in {name for name, *_ in eng.graphs.captured}


def test_a_host_sync_in_a_tree_step_fails_its_emulated_capture(tiny_bundle, code_prompts, monkeypatch):
    """The twin catches what a CUDA capture refuses: a verify that reads a value on the host."""
    import specdec.decoder.engine as engine_mod

    real = engine_mod.tree_verify

    def syncing(target, cache, rows, tree, topk, u):
        rows.lengths.max().item()  # e.g. a span read off the device
        return real(target, cache, rows, tree, topk, u)

    monkeypatch.setattr(engine_mod, "tree_verify", syncing)
    eng = Engine(tiny_bundle, "eagle", k=3, topk=2, num_draft_tokens=6, cuda_graphs="emulate")
    with pytest.raises(RuntimeError, match="syncs the host: Tensor.item"):
        eng.generate(code_prompts, max_new_tokens=4)
    assert Engine(tiny_bundle, "eagle", k=3, topk=2, num_draft_tokens=6, cuda_graphs="off").generate(
        code_prompts, max_new_tokens=4).steps > 0  # eager, the same step is fine


def test_after_a_tree_step_the_committed_cache_is_what_a_prefill_writes(tiny_bundle, code_prompts):
    """The accepted path's keys and values, moved into place, are those of the committed tokens read in order."""
    from specdec.decoder.kv_cache import KVCache
    from specdec.decoder.engine import SamplingParams

    eng = Engine(tiny_bundle, "eagle", k=4, topk=4, num_draft_tokens=12, cuda_graphs="off")
    eng.admit(code_prompts, SamplingParams(max_new_tokens=30))
    moved = 0
    for _ in range(3):
        moved += sum(max(0, len(up.tokens) - 1) for up in eng.step())
    assert moved > 0  # some drafts were accepted, so some keys and values were moved
    for b in range(len(code_prompts)):
        L = int(eng.cache.lengths[b])
        fresh = KVCache.for_model(eng.target, 1, L)
        eng.target(eng.rows.tokens[b : b + 1, :L], torch.arange(L).unsqueeze(0), fresh)
        for layer in range(len(fresh.k)):
            assert torch.allclose(eng.cache.k[layer][b, :, :L], fresh.k[layer][0], atol=1e-5)
            assert torch.allclose(eng.cache.v[layer][b, :, :L], fresh.v[layer][0], atol=1e-5)


@pytest.mark.parametrize("method", ["eagle", "mtp"])
def test_a_topk_1_tree_is_the_chain(tiny_bundle, engine, plain, code_prompts, method):
    """The tree's path at topk 1 (forced here: the engine runs the chain itself) drafts and accepts what the chain does."""
    chain = engine(method, 4).generate(code_prompts, max_new_tokens=N)
    eng = Engine(tiny_bundle, method, k=4, cuda_graphs="off")
    eng.tree = eng.shape
    tree = eng.generate(code_prompts, max_new_tokens=N)
    assert tree.tokens == chain.tokens == plain.tokens
    assert np.array_equal(tree.accepted, chain.accepted)


@pytest.mark.parametrize("method", ["mtp", *later("eagle")])
def test_a_tree_accepts_at_least_the_chain_of_its_depth(tiny_bundle, engine, code_prompts, method):
    """Mean accepted drafts per verify step (tau - 1), depth 4, the zoo's four ragged prompts, greedy."""
    chain = engine(method, 4).generate(code_prompts, max_new_tokens=N).stats.tau - 1
    trees = {(topk, ndt): Engine(tiny_bundle, method, k=4, topk=topk, num_draft_tokens=ndt, cuda_graphs="off")
             .generate(code_prompts, max_new_tokens=N).stats.tau - 1 for topk, ndt in ((2, 8), (4, 8), (4, 16))}
    print(f"\n{method}, depth 4, mean accepted drafts: chain {chain:.2f}; "
          + "; ".join(f"topk {t} num_draft_tokens {n}: {a:.2f}" for (t, n), a in trees.items()))
    assert all(a >= chain for a in trees.values())
    assert trees[4, 16] >= chain + 0.3


def test_decode_takes_sglang_s_tree_flags(capsys):
    """`specdec decode --topk --num-steps --num-draft-tokens`, in this process; bad combinations are one line."""
    import json

    from specdec.cli import main

    tree = ["--topk", "2", "--num-steps", "3", "--num-draft-tokens", "6"]
    assert main(["decode", "--model", "tiny", "--method", "eagle", *tree, "--max-new-tokens", "24", "--compare",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["k"], out["topk"], out["num_draft_tokens"], out["same_as_plain"]) == (3, 2, 6, True)
    for args, says in ((["--method", "draft", "--topk", "2"], "draft drafts a chain"),
                       (["--num-steps", "3", "--k", "4"], "disagree"),
                       (["--topk", "1", "--num-draft-tokens", "3"], "topk 1 is a chain")):
        assert main(["decode", "--model", "tiny", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
