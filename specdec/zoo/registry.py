"""Where zoos live and how a model argument (zoo name, directory, hub id) becomes paths."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specdec.decoder.paths import ModelNotFound
from specdec.zoo.recipes import RECIPES

PACKAGE_DIR = Path(__file__).resolve().parent  # the shipped zoo: specdec/zoo/tiny
PARTS = ("target", "draft", "heads", "eagle")
REQUIRED_FILES = {"target": ("config.json", "model.safetensors", "tokenizer.json"),
                  "draft": ("config.json", "model.safetensors", "tokenizer.json"),
                  "heads": ("config.json", "model.safetensors"),
                  "eagle": ("config.json", "model.safetensors")}


class ZooError(Exception):
    """A zoo that is missing or damaged; the message names the file and how to rebuild."""


def user_zoo_root() -> Path:
    return Path(os.environ.get("SPECDEC_ZOO_DIR", Path.home() / ".cache" / "specdec" / "zoo"))


def zoo_roots() -> list[Path]:
    return [PACKAGE_DIR, user_zoo_root()]


def default_out(name: str) -> Path:
    """Where `specdec zoo build --recipe NAME` writes: the shipped zoo rebuilds in place."""
    return PACKAGE_DIR / name if name == "tiny" else user_zoo_root() / name


def find_zoo(name: str) -> Path | None:
    for root in zoo_roots():
        d = root / name
        if (d / "zoo.json").is_file() or (d / "target").is_dir():
            return d
    return None


def known_zoos() -> list[str]:
    names = set()
    for root in zoo_roots():
        if root.is_dir():
            names.update(p.name for p in root.iterdir() if (p / "zoo.json").is_file())
    return sorted(names)


def rebuild_hint(name: str) -> str:
    """How to get a zoo back: its recipe (from zoo.json when readable) and, for the shipped one, git."""
    recipe = name
    d = find_zoo(name)
    if d is not None:
        try:
            recipe = json.loads((d / "zoo.json").read_text()).get("recipe", name)
        except (OSError, json.JSONDecodeError):
            pass
    if recipe not in RECIPES:
        return f"build one with `specdec zoo build --recipe NAME` (recipes: {', '.join(RECIPES)})"
    hint = f"rebuild it with `specdec zoo build --recipe {recipe}" + ("" if d is None or d == default_out(recipe) else f" --out {d}") + "`"
    return hint + (" (or restore it with `git checkout specdec/zoo/tiny`)" if name == "tiny" else "")


def zoo_parts(name: str, check: bool = True) -> dict[str, Path]:
    """Paths of the zoo's parts; with `check`, every required file must exist and be non-empty."""
    d = find_zoo(name)
    if d is None:
        raise ZooError(f"no zoo named {name!r} (known: {', '.join(known_zoos()) or 'none'}); {rebuild_hint(name)}")
    meta = read_meta(d)
    parts = {p: d / meta.get("parts", {}).get(p, p) for p in PARTS}
    if check:
        for part, files in REQUIRED_FILES.items():
            for f in files:
                path = parts[part] / f
                if not path.is_file() or path.stat().st_size == 0:
                    raise ZooError(f"zoo {name!r} is missing {path}; {rebuild_hint(name)}")
    return parts


def read_meta(d: Path) -> dict:
    f = d / "zoo.json"
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as exc:
        raise ZooError(f"corrupted {f}: {exc}; {rebuild_hint(d.name)}") from None


def resolve(spec: str) -> dict | str:
    """A zoo name -> {part: directory}; anything else is returned as it is (a directory, a hub id)."""
    if find_zoo(spec) is None:
        return spec
    try:
        return dict(zoo_parts(spec))
    except ZooError as exc:
        raise ModelNotFound(str(exc)) from None
