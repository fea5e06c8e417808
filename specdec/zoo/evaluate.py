"""`specdec zoo eval`: the zoo's figures, measured on the held-out split (greedy, CPU, fp32).

- held-out loss / perplexity of target and draft per category, on fixed windows of each
  category's token stream (documents in corpus order, each followed by EOS);
- for every proposer, acceptance by draft position and tau at k = 1..4 per prompt category, on
  fixed prompts: 48-token windows of held-out code and prose, the first tokens of predictable docs;
- a greedy sample of the target on a code prompt, and how often its continuations of held-out
  top-level `def`/`class` lines are still valid Python (complete or incomplete, no SyntaxError).
"""

from __future__ import annotations

import codeop
import datetime
import json
import math
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specdec.decoder.bundle import ModelNotFound, load_bundle
from specdec.decoder.methods import METHODS as ALL_METHODS
from specdec.decoder.engine import Engine
from specdec.serving.measure.machine import machine
from specdec.zoo import report
from specdec.zoo.corpus import CATEGORIES, build_corpus
from specdec.zoo.recipes import RECIPES
from specdec.zoo.registry import PACKAGE_DIR, REQUIRED_FILES, ZooError, read_meta, rebuild_hint

METHODS = tuple(m for m in ALL_METHODS if m != "ar")  # the proposers
KS = (1, 2, 3, 4)
PROMPT_TOKENS = 48  # code and prose prompt windows
PREDICTABLE_PROMPT_TOKENS = 16  # at most; never more than half a predictable document
LOSS_WINDOW = 256
LOSS_WINDOWS = 64  # at most, per category
# The sample's prompt is its first 5 lines; the rest only fixes where the tokens split (see line_prompt).
SAMPLE_TEXT = "import os\nimport sys\n\n\ndef main(argv):\n    return 0\n"
SAMPLE_LINES = 5
SAMPLE_TOKENS = 80
GOLDEN = 0.6180339887  # spreads successive windows over a document without a random generator
GOAL_FIRST_ACCEPT = 0.60
GOAL_PYTHON_VALID = 0.50  # this evaluation's reading of "writes recognisable Python"
GOAL_TAU_SIGMAS, GOAL_TAU_RATIO = 3.0, 1.10  # this evaluation's reading of "clearly higher"


# -- data --------------------------------------------------------------------------------------
def trained_tokenizer(model_dir: Path):
    """The tokenizer exactly as trained: tokenizer.json read by `tokenizers` itself, whatever class
    transformers would pick for the directory (it loads any qwen2-typed one as Qwen2Tokenizer)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def tokenized_heldout(tok, corpus) -> dict[str, list[list[int]]]:
    """Held-out documents per category as token ids."""
    return {c: [tok.encode(d).ids for d in corpus.heldout[c]] for c in CATEGORIES}


def loss_windows(docs: list[list[int]], eos: int, window: int = LOSS_WINDOW, n: int = LOSS_WINDOWS) -> torch.Tensor:
    """Evenly spaced, non-overlapping windows [m, window + 1] of the category's stream."""
    stream = [t for d in docs for t in (*d, eos)]
    m = min(n, len(stream) // (window + 1))
    if m == 0:
        raise ValueError(f"held-out stream of {len(stream)} tokens is shorter than one window of {window + 1}")
    stride = len(stream) // m
    return torch.tensor([stream[i * stride: i * stride + window + 1] for i in range(m)])


@torch.no_grad()
def window_loss(model, windows: torch.Tensor, chunk: int = 16) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats) over every predicted position, and the token count."""
    total, count = 0.0, 0
    for i in range(0, len(windows), chunk):
        w = windows[i:i + chunk]
        logits, _ = model(w[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count, count


def spread_windows(docs: list[list[int]], n: int, length: int, tail: int) -> list[list[int]]:
    """n fixed windows of `length` tokens, one per document in turn (documents with room for
    `tail` more tokens after the window), at offsets spread by the golden ratio."""
    eligible = [d for d in docs if len(d) >= length + tail + 1]
    if not eligible:
        raise ValueError(f"no held-out document has {length + tail + 1} tokens")
    out = []
    for j in range(n):
        if n <= len(eligible):
            d, r = eligible[j * len(eligible) // n], 0
        else:
            d, r = eligible[j % len(eligible)], j // len(eligible)
        start = int(((r + 0.5) * GOLDEN % 1.0) * (len(d) - length - tail))
        out.append(d[start:start + length])
    return out


def category_prompts(docs: dict[str, list[list[int]]], n: int, new_tokens: int, eos: int) -> dict[str, list[list[int]]]:
    """The fixed prompts of each category. A predictable prompt is EOS (the document separator
    the model was trained with) and the first tokens of one held-out predictable document."""
    pred = [d for d in docs["predictable"] if len(d) >= 8]
    if len(pred) < n:
        raise ValueError(f"only {len(pred)} held-out predictable documents; ask for fewer prompts")
    step = len(pred) / n
    return {
        "predictable": [[eos] + pred[int(j * step)][:min(PREDICTABLE_PROMPT_TOKENS, len(pred[int(j * step)]) // 2)]
                        for j in range(n)],
        "code": spread_windows(docs["code"], n, PROMPT_TOKENS, new_tokens),
        "open-ended": spread_windows(docs["open-ended"], n, PROMPT_TOKENS, 8),
    }


def line_prompt(tok, text: str, lines: int) -> list[int]:
    """The tokens of `text`, tokenized whole, up to the one holding the line break of line `lines`.

    Cutting the token sequence, not the text, keeps the prompt's last token what it is in running
    text: a tokenizer may join a line break with the punctuation before it or the indentation after
    it, and a prompt cut elsewhere would end in a token the model rarely saw there."""
    end = sum(len(ln) for ln in text.splitlines(keepends=True)[:lines])  # chars through that line break
    enc = tok.encode(text)
    return [i for i, (start, _) in zip(enc.ids, enc.offsets) if start < end]


def toplevel_prompts(tok, texts: list[str], n: int) -> list[list[int]]:
    """The first top-level `def` or `class` line of each held-out module, with its line break, up to n."""
    out = []
    for text in texts:
        starts = [m for m in (text.find("\ndef "), text.find("\nclass ")) if m >= 0]
        if not starts:
            continue
        out.append(line_prompt(tok, text[min(starts) + 1:], 1))
        if len(out) == n:
            break
    return out


def valid_python_so_far(text: str) -> bool:
    """No SyntaxError in the complete lines of `text` (an unfinished block or string counts as valid)."""
    cut = text[: text.rfind("\n") + 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences and the like: warnings, not errors
        try:
            codeop.compile_command(cut, "<sample>", "exec")
            return True
        except SyntaxError as exc:
            return str(exc.msg).startswith("unterminated triple-quoted string")  # cut inside a docstring
        except (ValueError, OverflowError):
            return False


# -- measurements ------------------------------------------------------------------------------
def acceptance_row(res, plain, k: int) -> dict:
    """One (proposer, category, k) cell: tau, acceptance by position, and losslessness."""
    s = res.stats
    return {"k": k, "tau": round(s.tau, 4), "tau_stderr": round(s.tau_stderr, 4),
            "by_position": [round(float(x), 4) for x in s.by_position], "steps": s.steps,
            "tokens": res.new_tokens, "identical_to_plain": res.tokens == plain.tokens}


def judge_goals(fig: dict) -> list[dict]:
    """The issue's goals, each with the measured value, the threshold and the margin."""
    goals = []
    py = fig["python"]
    goals.append({"goal": "the target writes recognisable Python",
                  "measure": f"held-out top-level def/class lines whose greedy continuation is valid Python so far "
                             f"({py['valid']} of {py['prompts']})",
                  "value": py["valid_fraction"], "threshold": GOAL_PYTHON_VALID})
    for method, label in (("mtp", "MTP layer's first proposal"), ("heads", "first parallel head")):
        row = fig["acceptance"][method]["code"][0]  # k = 1: the first proposal alone
        goals.append({"goal": f"{label} accepted >= 60% on code",
                      "measure": f"acceptance of draft 1 at k=1 on code ({row['steps']} steps)",
                      "value": row["by_position"][0], "threshold": GOAL_FIRST_ACCEPT})
    for method in METHODS:
        p, o = fig["acceptance"][method]["predictable"][-1], fig["acceptance"][method]["open-ended"][-1]
        se = math.hypot(p["tau_stderr"], o["tau_stderr"])
        need = max(o["tau"] + GOAL_TAU_SIGMAS * se, o["tau"] * GOAL_TAU_RATIO)
        goals.append({"goal": f"tau clearly higher on predictable than open-ended ({method})",
                      "measure": f"tau at k={KS[-1]}: predictable {p['tau']:.2f} vs open-ended {o['tau']:.2f} "
                                 f"(needs > {GOAL_TAU_SIGMAS:g} s.e. and >= {GOAL_TAU_RATIO:.2f}x)",
                      "value": p["tau"], "threshold": round(need, 4)})
    for g in goals:
        g["met"] = g["value"] >= g["threshold"]
        g["margin"] = round(g["value"] - g["threshold"], 4)
    return goals


def fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file of the zoo but zoo.json: was it replaced meanwhile?"""
    return {str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in sorted(Path(root).rglob("*")) if f.is_file() and f.name != "zoo.json"}


def load_zoo_bundle(root: Path):
    """Every part of the zoo at `root`, fp32 on the CPU; a missing or damaged file is a ZooError."""

    meta = read_meta(root)
    parts = {p: root / meta.get("parts", {}).get(p, p) for p in REQUIRED_FILES}
    for part, files in REQUIRED_FILES.items():
        for f in files:
            if not (parts[part] / f).is_file() or (parts[part] / f).stat().st_size == 0:
                raise ZooError(f"zoo at {root} is missing {parts[part] / f}; {rebuild_hint(root.name)}")
    try:
        bundle = load_bundle(str(parts["target"]), device="cpu", dtype=torch.float32)
    except ModelNotFound as exc:
        raise ZooError(f"{exc}; {rebuild_hint(root.name)}") from None
    for part, attr in (("draft", "draft"), ("heads", "heads"), ("eagle", "eagle"), ("target", "mtp")):
        if getattr(bundle, attr) is None:
            raise ZooError(f"zoo at {root}: {parts[part]} gave no {attr}; {rebuild_hint(root.name)}")
    return bundle, meta


def evaluate_zoo(root: Path, prompts: int = 8, new_tokens: int = 48, write: bool = False,
                 loss_windows_per_category: int = LOSS_WINDOWS) -> dict:
    """Measure the figures, print them, and with `write` store them in zoo.json (and docs/zoo.md
    for the shipped zoo). Returns the figures. loss_windows_per_category: held-out windows of
    LOSS_WINDOW tokens each model's loss is measured on (at most; fewer where a category is short)."""

    if prompts < 1 or new_tokens < 1:
        raise ValueError("prompts and new_tokens must be >= 1")
    root = Path(root)
    t0 = time.time()
    before = fingerprint(root)
    bundle, meta = load_zoo_bundle(root)
    tok, eos = trained_tokenizer(bundle.paths["target"]), bundle.eos_token_ids[0]
    recipe = RECIPES.get(meta.get("recipe", ""))
    corpus = build_corpus(seed=recipe.seed if recipe else 0)
    docs = tokenized_heldout(tok, corpus)
    cat_prompts = category_prompts(docs, prompts, new_tokens, eos)
    py_prompts = toplevel_prompts(tok, corpus.heldout["code"], prompts)
    sample_ids = line_prompt(tok, SAMPLE_TEXT, SAMPLE_LINES)
    engines: dict[tuple, Engine] = {}
    longest = max(len(p) for ps in [*cat_prompts.values(), py_prompts, [sample_ids]] for p in ps)
    max_len = longest + max(new_tokens, SAMPLE_TOKENS, 64) + max(KS) + 2

    def generate(prompts, method, k=1, max_new_tokens=new_tokens):
        """All prompts in one batch, on an engine sized for them (kept for the next category)."""
        key = (method, k, len(prompts))
        if key not in engines:
            engines[key] = Engine(bundle, method, k=k, max_batch=len(prompts), max_len=max_len, cuda_graphs="off")
        return engines[key].generate(prompts, max_new_tokens=max_new_tokens)

    total = 2 * len(CATEGORIES) + len(CATEGORIES) * (1 + len(METHODS) * len(KS)) + 2
    bar = tqdm(total=total, desc="zoo eval", mininterval=1.0)
    losses: dict[str, dict] = {"target": {}, "draft": {}}
    for c in CATEGORIES:
        windows = loss_windows(docs[c], eos, n=loss_windows_per_category)
        for name, model in (("target", bundle.target), ("draft", bundle.draft)):
            loss, n = window_loss(model, windows)
            losses[name][c] = {"loss": round(loss, 4), "ppl": round(math.exp(loss), 3), "tokens": n,
                               "windows": len(windows)}
            bar.update()
    acceptance: dict[str, dict] = {m: {} for m in METHODS}
    for c in CATEGORIES:
        plain = generate(cat_prompts[c], "ar")
        bar.update()
        for m in METHODS:
            acceptance[m][c] = []
            for k in KS:
                bar.set_postfix_str(f"{c} {m} k={k}")
                res = generate(cat_prompts[c], m, k)
                acceptance[m][c].append(acceptance_row(res, plain, k))
                bar.update()
    sample = generate([sample_ids], "ar", max_new_tokens=SAMPLE_TOKENS)
    sample_text = tok.decode(sample_ids + sample.tokens[0])
    bar.update()
    py_res = generate(py_prompts, "ar", max_new_tokens=64)
    valid = [valid_python_so_far(tok.decode(p + t)) for p, t in zip(py_prompts, py_res.tokens)]
    bar.update()
    bar.close()

    fig = {
        "measured": {"command": f"specdec zoo eval {meta.get('name', root.name)} --prompts {prompts} "
                                f"--new-tokens {new_tokens}" + (" --write" if write else ""),
                     "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                     "device": "cpu", "dtype": "float32", "decoding": "greedy",
                     **machine(torch.get_num_threads(), torch=torch.__version__),
                     "seconds": None, "heldout_docs": corpus.summary()["heldout_docs"]},
        "prompts": {"per_category": prompts, "new_tokens": new_tokens,
                    "prompt_tokens": {c: sum(map(len, p)) for c, p in cat_prompts.items()},
                    "how": {"predictable": f"EOS + the first <= {PREDICTABLE_PROMPT_TOKENS} tokens of held-out "
                                           "predictable documents",
                            "code": f"{PROMPT_TOKENS}-token windows of held-out standard-library modules",
                            "open-ended": f"{PROMPT_TOKENS}-token windows of held-out reference-manual topics"},
                    "encoding": "tokenizer.json read by the `tokenizers` library, as in training"},
        "heldout_loss": losses,
        "acceptance": acceptance,
        "sample": {"prompt": tok.decode(sample_ids), "new_tokens": len(sample.tokens[0]),
                   "text": sample_text[len(tok.decode(sample_ids)):], "valid_python_so_far": valid_python_so_far(sample_text)},
        "python": {"prompts": len(py_prompts), "valid": sum(valid),
                   "valid_fraction": round(sum(valid) / max(1, len(valid)), 4), "new_tokens": 64},
    }
    fig["goals"] = judge_goals(fig)
    fig["measured"]["seconds"] = round(time.time() - t0, 1)
    print(report.format_figures(fig))
    if write:
        if fingerprint(root) != before:
            raise ZooError(f"the zoo at {root} changed while it was being measured; nothing written: run again")
        _write(root, fig)
    return fig


def _write(root: Path, fig: dict) -> None:
    """Figures into zoo.json (its other keys, read afresh, kept); docs/zoo.md when this is the shipped zoo."""

    meta = {**read_meta(root), "figures": fig}
    (root / "zoo.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote the figures to {root / 'zoo.json'}")
    shipped = root.resolve() == (PACKAGE_DIR / "tiny").resolve()
    if shipped and (report.REPO_ROOT / "pyproject.toml").is_file():  # a source checkout, not an installed wheel
        doc = report.REPO_ROOT / "docs" / "zoo.md"
        doc.parent.mkdir(exist_ok=True)
        doc.write_text(report.zoo_markdown(report.zoo_info(root)))
        print(f"wrote {doc}")
