"""Text about a zoo: `specdec zoo info`, the figures tables of `specdec zoo eval`, and docs/zoo.md.

Nothing here measures anything: every number comes from the zoo's files and its zoo.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from specdec.decoder.methods import LABELS
from specdec.zoo.corpus import CATEGORIES
from specdec.zoo.registry import PACKAGE_DIR, read_meta

REPO_ROOT = PACKAGE_DIR.parent.parent  # a source checkout; docs/ and benchmarks/ live there
TRAIN_SCRIPT, TRAIN_LOG = "benchmarks/train_zoo_gpu.sh", "benchmarks/logs/train_zoo_gpu.log"


def table(headers: list[str], rows: list[list]) -> str:
    """An aligned pipe table: readable on a console and valid Markdown."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]])


def _size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def zoo_info(root: Path) -> dict:
    """What `specdec zoo info --json` prints, for a zoo directory."""
    root = Path(root)
    meta = read_meta(root)
    parts = {p: root / meta.get("parts", {}).get(p, p) for p in ("target", "draft", "heads", "eagle")}
    return {"name": meta.get("name", root.name), "root": str(root),
            "parts": {p: {"path": str(d), "bytes": _size(d) if d.is_dir() else 0} for p, d in parts.items()},
            "total_bytes": _size(root), **{k: v for k, v in meta.items() if k != "parts"}}


def _config(path: str) -> dict:
    try:
        return json.loads((Path(path) / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _layout(cfg: dict) -> str:
    arch = ", ".join(cfg.get("architectures", [])) or "?"
    if cfg.get("model_type") == "specdec_mtp_heads":
        return f"{arch}: {cfg.get('num_heads')} heads over hidden {cfg.get('hidden_size')}"
    n = cfg.get("num_hidden_layers")
    shape = f"{n} layer{'' if n == 1 else 's'}, hidden {cfg.get('hidden_size')}, vocab {cfg.get('vocab_size')}"
    extra = ", + 1 MTP layer (model.mtp_layers.0.*)" if cfg.get("num_nextn_predict_layers") else ""
    return f"{arch} (model_type {cfg.get('model_type')}): {shape}{extra}"


def _params(info: dict) -> str:
    p = info.get("params", {})
    if not p:
        return "params: not recorded"
    names = {"target": "target", "mtp_layer": "its MTP layer", "draft": "draft", "heads": "heads", "eagle": "EAGLE head"}
    return "params: " + ", ".join(f"{names.get(k, k)} {v:,}" for k, v in p.items())


def training_lines(info: dict) -> list[str]:
    """One line per training stage, from zoo.json."""
    t = info.get("training")
    if not t:
        return ["training: not recorded in zoo.json"]
    out = [f"trained with recipe {info.get('recipe', '?')} on {t.get('device')} (torch {t.get('torch')}, "
           f"Python {t.get('python')}) in {t.get('seconds')} s"]
    sd = t.get("self_distillation_data")
    if sd:
        out.append(f"  self-distillation data: {sd['sequences']:,} greedy continuations by the target, "
                   f"{sd['tokens']:,} tokens, {sd['seconds']} s")
    for s in t.get("stages", []):
        best = s.get("best", {})
        if "heldout_loss" in best:
            b = f"best held-out loss {best['heldout_loss']} (ppl {best.get('heldout_ppl')}) at step {best.get('step')}"
        else:
            agree = best.get("heldout_top1_agreement", {})
            b = "held-out top-1 agreement with the target " + ", ".join(f"{k} {v:.3f}" for k, v in agree.items())
        out.append(f"  {s['name']}: {s['steps']:,} steps, {s['tokens']:,} tokens, {s['seconds']} s; {b}")
    u = info.get("mtp_unrolled")
    if u:
        c, b = u["candidates"][u["installed"]], u["candidates"]["shipped"]
        out.append(f"  MTP layer retrained alone, chained over {len(u['mtp_weights'])} draft steps, on {u['device']} "
                   f"(torch {u['torch']}) by `{u['script']}`: {c['steps']:,} steps from {c['init']} in {c['seconds']} s; "
                   "held-out greedy acceptance by position " + " ".join(f"{x:.3f}" for x in b["acceptance_by_position"])
                   + " -> " + " ".join(f"{x:.3f}" for x in c["acceptance_by_position"]))
    c = info.get("corpus")
    if c:
        out.append(f"  corpus: Python {c['python']} standard library, {c['modules']} modules, {c['train_docs']:,} "
                   f"training documents ({c['train_chars']:,} characters); held-out documents: "
                   + ", ".join(f"{n} {cat}" for cat, n in c["heldout_docs"].items()))
    return out


def format_info(info: dict) -> str:
    """`specdec zoo info`: parts with paths and sizes, total, params, training, figures."""
    name = info.get("name", "?")
    lines = [f"zoo {name} at {info.get('root')}" + (f" ({info['notes']})" if info.get("notes") else "")]
    rows = [[p, f"{d['bytes']:,}", d["path"], _layout(_config(d["path"]))] for p, d in info.get("parts", {}).items()]
    lines += ["", table(["part", "bytes", "path", "layout"], rows), f"total {info.get('total_bytes', 0):,} bytes",
              _params(info), *training_lines(info), ""]
    if info.get("figures"):
        lines.append(format_figures(info["figures"]))
    else:
        lines.append(f"figures: not measured yet; measure them with `specdec zoo eval {name} --write`")
    return "\n".join(lines)


def _k_cell(row: dict) -> str:
    return " ".join(f"{x:.2f}" for x in row["by_position"])


def figure_tables(fig: dict) -> list[tuple[str, str]]:
    """(title, table) pairs of the measured figures."""
    loss = fig["heldout_loss"]
    out = [("Held-out loss in nats per token (perplexity), fixed windows of each category's token stream",
            table(["model"] + [f"{c} loss (ppl)" for c in CATEGORIES] + ["tokens per category"],
                  [[m] + [f"{loss[m][c]['loss']:.3f} ({loss[m][c]['ppl']:.2f})" for c in CATEGORIES]
                   + [" / ".join(str(loss[m][c]["tokens"]) for c in CATEGORIES)] for m in loss]))]
    acc = fig["acceptance"]
    ks = [r["k"] for r in next(iter(next(iter(acc.values())).values()))]
    rows, pos_rows = [], []
    for m, by_cat in acc.items():
        for c in CATEGORIES:
            rs = by_cat[c]
            lossless = "yes" if all(r["identical_to_plain"] for r in rs) else "NO"
            rows.append([LABELS.get(m, m), c] + [f"{r['tau']:.2f} ± {r['tau_stderr']:.2f}" for r in rs]
                        + [str(rs[-1]["steps"]), lossless])
            pos_rows.append([LABELS.get(m, m), c] + [_k_cell(r) for r in rs])
    p = fig["prompts"]
    out.append((f"tau = tokens per verify step (± s.e.), greedy, {p['per_category']} prompts per category, "
                f"{p['new_tokens']} new tokens each",
                table(["proposer", "category"] + [f"k={k}" for k in ks] + [f"steps at k={ks[-1]}", "same as plain"], rows)))
    out.append(("Acceptance by draft position (fraction of verify steps whose i-th draft was accepted)",
                table(["proposer", "category"] + [f"k={k}" for k in ks], pos_rows)))
    goals = fig.get("goals", [])
    if goals:
        out.append(("What the zoo was built to reach, and whether it does",
                    table(["goal", "measured", "value", "threshold", "met", "margin"],
                          [[g["goal"], g["measure"], f"{g['value']:.3f}", f"{g['threshold']:.3f}",
                            "yes" if g["met"] else "NO", f"{g['margin']:+.3f}"] for g in goals])))
    return out


def format_figures(fig: dict) -> str:
    """The figures as console text."""
    m = fig["measured"]
    lines = [f"figures measured {m['date']} by `{m['command']}` on {m['cpu']} ({m['threads']} threads, "
             f"torch {m['torch']}, Python {m['python']}; {m['device']}, {m['dtype']}, {m['decoding']}) "
             f"in {m['seconds']} s"]
    for title, t in figure_tables(fig):
        lines += ["", title, t]
    s = fig["sample"]
    lines += ["", f"greedy sample of the target ({s['new_tokens']} new tokens; valid Python so far: "
                  f"{'yes' if s['valid_python_so_far'] else 'no'}):", "-" * 60, s["prompt"] + s["text"], "-" * 60]
    return "\n".join(lines)


def mtp_unrolled_markdown(u: dict, fig: dict | None) -> list[str]:
    """docs/zoo.md's section on the MTP layer retrained as decoding chains it, with figures before and after."""
    k = len(u["mtp_weights"])
    cands = u["candidates"]
    lines = ["## The MTP layer, trained as it is used", "",
             f"Decoding applies the MTP layer k = {k} times per verify step: step 1 reads the target's hidden state "
             "`h_t` and the token `x_{t+1}`; step d > 1 reads the layer's own output state of step d - 1 and the token "
             "drafted before it. The recipe first trained it on target hidden states only; "
             f"`{u['script']}` then retrained the shipped layer alone (the target body, draft, heads and EAGLE head "
             "kept byte for byte), chained over k steps (`specdec.zoo.train.mtp_unrolled`), on the recipe's "
             "self-distillation data rebuilt from the shipped target, with the loss of step d weighted "
             + ", ".join(f"{w:g}" for w in u["mtp_weights"]) + " (soft cross-entropy against the target's "
             "distribution at the matching offset). Log: `" + u["log"] + "`.", "",
             "What training matches: step d at position p (the chain anchored at a = p - d + 1) reads step d - 1's "
             "state at p - 1 and the token `x_{p+1}`, and its attention sees exactly what the layer's KV cache holds "
             "at that moment of a decode: entries written from target hidden states at the committed positions "
             "<= a, and the chain's own entries of steps 2..d at a + 1..p (the cache is extended over the verified "
             "positions first, then filled one draft step at a time); the token input is zeroed at position 0 in both. "
             "`tests/test_zoo.py` checks the training forward against the layer's cached decode forward.", "",
             "What it approximates: step d reads the tokens of the training text (teacher forcing), where decoding "
             "reads the layer's own drafts; the two agree exactly when the earlier drafts were accepted, the only "
             "case in which step d's draft counts (on the half of each batch that the target wrote itself they are "
             "its own greedy tokens; on the corpus half they are the corpus's, with the target's distributions "
             "conditioned on the same tokens). Every position of a window is an anchor with equal weight, where a "
             "decode visits the anchors its acceptances lead to; training runs in bf16, decoding here in fp32.", ""]
    rows = [[n, c["init"], f"{c['steps']:,}" if "steps" in c else "-", " ".join(f"{x:.3f}" for x in c["acceptance_by_position"]),
             f"{c['tau_estimate']:.2f}", "yes" if n == u["installed"] else ""] for n, c in cands.items()]
    # "shipped" is the layer as the recipe trained it; the others were retrained from it or from scratch.
    lines += [f"Candidates, compared on {u['heldout_metric']}; 1 + their sum estimates tau at k = {k}:", "",
              table(["candidate", "starting point", "steps", f"acceptance by position 1..{k}", "tau estimate", "installed"], rows), ""]
    before = (u.get("before") or {}).get("acceptance")
    after = (fig or {}).get("acceptance", {}).get("mtp")
    if before and after:
        rows = []
        for c in CATEGORIES:
            b, a = before[c][-1], after[c][-1]
            rows.append([c, f"{b['tau']:.2f} ± {b['tau_stderr']:.2f}", f"{a['tau']:.2f} ± {a['tau_stderr']:.2f}",
                         _k_cell(b), _k_cell(a)])
        k_last = after[CATEGORIES[0]][-1]["k"]
        lines += [f"The decoder's figures for the MTP layer at k = {k_last} (greedy, CPU, fp32, the prompts of the "
                  f"measured figures below, the same decoder): before, the layer as first trained ({u['before'].get('weights', '')}), "
                  f"measured by `{u['before']['command']}` on {u['before']['date']} (log `{u['before']['log']}`); after, "
                  f"the measured figures below:", "",
                  table(["category", "tau before", "tau after", f"acceptance by position 1..{k_last} before", "after"], rows), ""]
    return lines


def zoo_markdown(info: dict) -> str:
    """docs/zoo.md: what the zoo is, how it was trained, and its measured figures."""
    name, fig = info.get("name", "?"), info.get("figures")
    root = Path(info["root"])
    rel = root.resolve().relative_to(REPO_ROOT) if root.resolve().is_relative_to(REPO_ROOT) else root
    lines = [f"# The embedded model zoo: `{name}`", "",
             "<!-- written by `specdec zoo eval " + name + " --write`; do not edit by hand -->", "",
             f"The zoo lives in `{rel}/` and is what `--model {name}` loads: a tiny target in the MiMo layout "
             "(a Qwen2 body plus one MTP layer), a smaller Llama draft, parallel MTP heads and an EAGLE head, "
             "all trained by `specdec/zoo/` on the Python standard library's source and generated predictable "
             "text, in Hugging Face format (config.json, model.safetensors, tokenizer files).", "",
             "## Parts", ""]
    rows = []
    for p, d in info["parts"].items():
        rows.append([p, f"`{Path(d['path']).name}/`", _layout(_config(d["path"])), f"{d['bytes']:,}"])
    lines += [table(["part", "directory", "layout", "bytes"], rows), "",
              f"Total on disk (with zoo.json): {info['total_bytes']:,} bytes. P{_params(info)[1:]}.", ""]
    frows = []
    for p, d in info["parts"].items():
        for f in sorted(Path(d["path"]).iterdir()):
            if f.is_file():
                frows.append([f"`{p}/{f.name}`", f"{f.stat().st_size:,}"])
    lines += [table(["file", "bytes"], frows), "", "## How it was trained", ""]
    lines += ["- " + ln.strip() for ln in training_lines(info)]
    script, log = REPO_ROOT / TRAIN_SCRIPT, REPO_ROOT / TRAIN_LOG
    if name == "tiny" and script.is_file() and log.is_file():
        lines.append(f"- script: `{TRAIN_SCRIPT}`; its log: `{TRAIN_LOG}`; rebuild with "
                     f"`specdec zoo build --recipe {info.get('recipe', name)} --device cuda`")
    lines.append("")
    if info.get("mtp_unrolled"):
        lines += mtp_unrolled_markdown(info["mtp_unrolled"], fig)
    if not fig:
        lines += ["## Measured figures", "", f"Not measured yet: `specdec zoo eval {name} --write`.", ""]
        return "\n".join(lines)
    m = fig["measured"]
    lines += ["## Measured figures", "",
              f"Measured on {m['date']} by `{m['command']}` in {m['seconds']} s on {m['cpu']} "
              f"({m['threads']} threads), torch {m['torch']}, Python {m['python']}: {m['device']}, {m['dtype']}, "
              f"{m['decoding']} decoding. The held-out split of this Python's standard library has "
              + ", ".join(f"{n} {c}" for c, n in m["heldout_docs"].items())
              + f" documents. The console output is kept in `benchmarks/logs/zoo_eval_{name}.log`.", "",
              "Prompts: " + "; ".join(f"{c}: {h}" for c, h in fig["prompts"]["how"].items()) + ". "
              f"Text is encoded with {fig['prompts'].get('encoding', 'the zoo tokenizer')}. "
              "tau = tokens per verify step = accepted drafts + 1.", ""]
    trained_on = (info.get("training") or {}).get("python")
    if trained_on and trained_on != m["python"]:
        lines += [f"The zoo was trained on Python {trained_on}'s standard library and these figures use Python "
                  f"{m['python']}'s: the held-out modules have the same names (the split hashes names) but their "
                  "source differs, so the held-out loss here is not the training log's (which used 64 random "
                  "512-token windows of the held-out code stream).", ""]
    for title, t in figure_tables(fig):
        lines += [f"### {title}", "", t, ""]
    met = [g for g in fig.get("goals", []) if g["met"]]
    missed = [g for g in fig.get("goals", []) if not g["met"]]
    lines += ["Goals met: " + ("; ".join(g["goal"] for g in met) or "none") + ".", "",
              "Goals missed: " + ("; ".join(f"{g['goal']} (by {-g['margin']:.3f})" for g in missed) or "none") + ".", ""]
    s = fig["sample"]
    lines += [f"### Greedy sample of the target ({s['new_tokens']} new tokens after the prompt)", "",
              "```python", s["prompt"] + s["text"], "```", ""]
    return "\n".join(lines)
