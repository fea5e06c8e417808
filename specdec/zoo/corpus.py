"""The training corpus: text every machine has, chosen deterministically.

- code: the running Python's standard-library source (sorted; tests, IDLE, lib2to3 left out),
  split into train and held-out by a hash of each module's path;
- prose: the Python reference docs shipped as `pydoc_data.topics`, split the same way by topic;
- predictable: generated counting, alphabets, weekdays and months, from a seed.
The held-out parts give the three categories the zoo is trained and evaluated on: predictable, code,
open-ended. Lab 2 adds a fourth prompt category, grounded: a held-out code passage, an edit marker, then the
passage again, so that the continuation copies text of the prompt (summarising or editing a document does
that; n-gram prompt lookup drafts exactly there). It is built from the held-out code, not trained on.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

EXCLUDED_DIRS = {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "__pycache__",
                 "lib2to3", "turtledemo", "ensurepip", "pydoc_data"}
MAX_FILE_BYTES = 200_000  # a few huge generated modules would dominate a small corpus
HELDOUT_PERCENT = 8
CATEGORIES = ("predictable", "code", "open-ended")
GROUNDED = "grounded"
PROMPT_CATEGORIES = CATEGORIES + (GROUNDED,)  # Lab 2's prompt categories
EDIT_MARKER = "\n# --- the lines above, after the edit ---\n"  # ends the passage; the copy starts after it


def is_heldout(name: str) -> bool:
    """A stable split by name: the same answer on every machine and Python version."""
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_modules(root: Path | None = None) -> list[Path]:
    """The selected modules, sorted by their path relative to the standard library. The walk does not enter the
    folders left out (site-packages is one, inside the standard library of many installs): what Path.rglob("*.py")
    found there was dropped anyway, after two thirds of the time build_corpus took."""
    root = root or stdlib_root()
    out = []
    for folder, dirs, files in os.walk(root):  # as rglob: symlinked folders are not followed
        here = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS and not (here.parts == () and d.startswith("config-"))]
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = here / name  # its folders passed the walk's filter; a top-level config-* file is left out too
            if here.parts == () and name.startswith("config-"):
                continue
            if (root / rel).stat().st_size > MAX_FILE_BYTES:
                continue
            out.append(rel)
    return sorted(out, key=lambda r: r.as_posix())


def prose_topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip the docs
        return {}
    return dict(sorted(topics.items()))


WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                "eighteen", "nineteen", "twenty"]


def _cycle(items: list[str], start: int, n: int) -> list[str]:
    return [items[(start + i) % len(items)] for i in range(n)]


def predictable_text(rng: random.Random) -> str:
    """One short, highly predictable document."""
    kind = rng.randrange(8)
    sep = rng.choice([", ", " ", "\n", "; "])
    if kind == 0:
        a, step = rng.randrange(0, 200), rng.choice([1, 1, 1, 2, 5, 10])
        return sep.join(str(a + step * i) for i in range(rng.randrange(10, 60)))
    if kind == 1:
        return sep.join(_cycle(NUMBER_WORDS[1:], rng.randrange(20), rng.randrange(5, 19)))
    if kind == 2:
        letters = "abcdefghijklmnopqrstuvwxyz"
        letters = letters.upper() if rng.random() < 0.5 else letters
        s = rng.randrange(10)
        return sep.join(letters[s:s + rng.randrange(8, 26 - s)])
    if kind == 3:
        return sep.join(_cycle(WEEKDAYS, rng.randrange(7), rng.randrange(5, 22)))
    if kind == 4:
        return sep.join(_cycle(MONTHS, rng.randrange(12), rng.randrange(5, 30)))
    if kind == 5:
        n = rng.randrange(5, 25)
        return f"numbers = [{', '.join(str(i) for i in range(n))}]"
    if kind == 6:
        var = rng.choice(["i", "j", "n", "day", "month"])
        items = rng.choice([WEEKDAYS, MONTHS])
        body = "\n".join(f"{var}_{k} = {items[k % len(items)]!r}" for k in range(rng.randrange(4, 14)))
        return body
    return "\n".join(f"{i}. {w}" for i, w in enumerate(_cycle(MONTHS + WEEKDAYS, rng.randrange(19), rng.randrange(5, 15)), 1))


@dataclass
class Corpus:
    """Documents by split and category."""

    train: list[str] = field(default_factory=list)
    heldout: dict[str, list[str]] = field(default_factory=dict)  # category -> documents
    modules: list[str] = field(default_factory=list)  # the selected module paths (train + held-out)
    python_version: str = ""

    def summary(self) -> dict:
        return {"python": self.python_version, "modules": len(self.modules),
                "train_docs": len(self.train), "train_chars": sum(map(len, self.train)),
                "heldout_docs": {c: len(d) for c, d in self.heldout.items()}}


def build_corpus(seed: int = 0, max_code_bytes: int | None = None, predictable_docs: int = 4000,
                 root: Path | None = None) -> Corpus:
    """Deterministic for a given Python version, seed and size cap."""
    root = root or stdlib_root()
    corpus = Corpus(heldout={c: [] for c in CATEGORIES}, python_version=sys.version.split()[0])
    used = 0
    for rel in stdlib_modules(root):
        name = rel.as_posix()
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        if is_heldout(name):
            corpus.heldout["code"].append(text)
        elif max_code_bytes is None or used < max_code_bytes:
            corpus.train.append(text)
            used += len(text)
        else:
            continue
        corpus.modules.append(name)
    for key, text in prose_topics().items():
        (corpus.heldout["open-ended"] if is_heldout("topic:" + key) else corpus.train).append(text)
    rng = random.Random(seed)
    corpus.train.extend(predictable_text(rng) for _ in range(predictable_docs))
    rng_eval = random.Random(seed + 1_000_003)  # held-out predictable text: same generator, other seed
    corpus.heldout["predictable"] = [predictable_text(rng_eval) for _ in range(200)]
    return corpus


def grounded_example(doc: str, rng: random.Random, lines: int = 12, shown: int = 2) -> tuple[str, str] | None:
    """An input-grounded prompt from one document: `lines` lines of it from a random line, the edit marker,
    then the first `shown` of those lines again. -> (prompt, continuation: the rest of the passage, which the
    prompt already holds), or None when the document has no passage of substantial, non-blank lines."""
    all_lines = doc.splitlines(keepends=True)
    starts = [i for i in range(len(all_lines) - lines)
              if all(ln.strip() for ln in all_lines[i:i + lines]) and sum(map(len, all_lines[i:i + lines])) >= 200]
    if not starts:
        return None
    i = rng.choice(starts)
    passage = all_lines[i:i + lines]
    body = "".join(passage).rstrip("\n")
    return body + EDIT_MARKER + "".join(passage[:shown]), "".join(passage[shown:])


def grounded_prompts(corpus: Corpus, n: int = 4, seed: int = 0, lines: int = 12,
                     shown: int = 2) -> list[tuple[str, str]]:
    """n input-grounded (prompt, continuation) pairs from the held-out code, one per document, seeded:
    the same pairs on every machine with the same Python (no download)."""
    rng = random.Random(seed)
    out = []
    for doc in rng.sample(corpus.heldout["code"], len(corpus.heldout["code"])):
        example = grounded_example(doc, rng, lines, shown)
        if example is not None:
            out.append(example)
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} held-out code documents have a passage of {lines} non-blank lines")
