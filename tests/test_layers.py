"""The package is one-way: each layer imports only from those below it (parsed, not imported).

sim (Lab 1, numpy) -> decoder (Lab 2, torch) -> serving (Lab 3) -> zoo, grading -> cli.
Inside serving, each part imports only what SERVING_MAY_IMPORT lists: the measuring side only the simulation
(no torch), the server the decoder and the simulation, the operations the measuring side and the decoder
(they start a server as a process, never by import).
Inside the package, imports sit at the top of a module; only optional heavy dependencies may be
imported inside a function (so that a light command never pays for them).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specdec"
LAYERS = {"sim": 0, "decoder": 1, "serving": 2, "zoo": 3, "grading": 3, "cli": 4}
# serving's parts: which other parts of specdec each may import (the root, specdec/__init__, always).
SERVING_MAY_IMPORT = {"measure": {"sim"}, "server": {"sim", "decoder"}, "ops": {"sim", "decoder", "measure"}}
# Imported inside functions on purpose: heavy, and needed only by some paths.
OPTIONAL_HEAVY = {"scipy", "matplotlib", "transformers", "huggingface_hub", "IPython", "traitlets",
                  "tokenizers", "pydoc_data", "sglang", "uvicorn", "triton"}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "zoo/tiny" not in str(p))


def package_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    if len(parts) == 1:
        return "cli" if parts[0] == "__main__.py" else "root"
    return parts[0]


def imports(tree: ast.Module):
    """(module name, nested?) for every import statement of the module."""
    top = set(map(id, tree.body))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, id(node) not in top, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] if node.module == "specdec" else [node.module]
            for n in names:
                yield n, id(node) not in top, node.lineno


def part_of(path: Path) -> str | None:
    """serving's part a module belongs to (measure, server or ops), None outside serving."""
    parts = path.relative_to(PACKAGE).parts
    return parts[1] if parts[0] == "serving" and len(parts) > 2 else None


def serving_part_of(name: str) -> str | None:
    """The package below specdec an import reaches, with serving's part spelled serving.measure etc."""
    parts = name.split(".")
    if parts[0] != "specdec" or len(parts) < 2:
        return None
    return f"serving.{parts[2]}" if parts[1] == "serving" and len(parts) > 2 else parts[1]


def serving_breaks(part: str, name: str) -> str | None:
    """Why serving's `part` may not import `name` (None if it may)."""
    target = serving_part_of(name)
    if target is None or target in ("__version__", f"serving.{part}") or layer_of(name) == "root":
        return None
    allowed = {t if t in LAYERS else f"serving.{t}" for t in SERVING_MAY_IMPORT[part]}
    if target not in allowed:
        return f"serving.{part} imports {name}: it may import only {sorted(allowed)}"
    return None


def layer_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] != "specdec":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "root"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_go_down_only(path):
    own = package_of(path)
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for name, nested, line in imports(tree):
        target = layer_of(name)
        if target is None:
            if nested and name.split(".")[0] not in OPTIONAL_HEAVY and name != "__future__":
                bad.append(f"line {line}: `{name}` imported inside a function (only optional heavy dependencies may be)")
            continue
        if nested:
            bad.append(f"line {line}: `{name}` imported inside a function")
        if own == "serving" and (why := serving_breaks(part_of(path), name)):
            bad.append(f"line {line}: {why}")
        if target in ("root", own) or own == "root":
            continue
        if own in ("zoo", "grading") and target in ("zoo", "grading"):
            bad.append(f"line {line}: {own} imports {name}: the zoo and the grader are independent")
        elif LAYERS[target] >= LAYERS.get(own, 99):
            bad.append(f"line {line}: {own} (layer {LAYERS[own]}) imports {name} (layer {LAYERS[target]}): upward")
    assert not bad, "\n".join(bad)


def test_the_check_catches_an_upward_import(tmp_path):
    """The parser above must see what it is meant to forbid."""
    tree = ast.parse("import os\ndef f():\n    from specdec.cli import main\n")
    found = list(imports(tree))
    assert ("os", False, 1) in found and ("specdec.cli", True, 3) in found
    assert layer_of("specdec.cli") == "cli" and LAYERS["cli"] > LAYERS["decoder"]


def test_serving_has_three_parts_and_no_loose_module():
    loose = [p.name for p in (PACKAGE / "serving").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules of serving outside its parts: {loose}"
    assert {p.name for p in (PACKAGE / "serving").iterdir() if p.is_dir() and p.name != "__pycache__"} == set(SERVING_MAY_IMPORT)


def test_the_check_catches_an_upward_import_inside_serving():
    """measure -> ops, measure -> server, server -> measure and ops -> server are each caught."""
    for part, name in (("measure", "specdec.serving.ops.lifecycle"), ("measure", "specdec.serving.server.app"),
                       ("measure", "specdec.decoder.engine"), ("server", "specdec.serving.measure.records"),
                       ("server", "specdec.serving.ops.launch"), ("ops", "specdec.serving.server.app")):
        assert serving_breaks(part, name), f"{part} importing {name} went unnoticed"
    for part, name in (("measure", "specdec.sim.formulas"), ("measure", "specdec.serving.measure.records"),
                       ("server", "specdec.decoder.engine"), ("server", "specdec.__version__"),
                       ("ops", "specdec.serving.measure.client"), ("ops", "specdec.decoder.methods")):
        assert serving_breaks(part, name) is None, f"{part} may import {name}"
    tree = ast.parse("from specdec.serving.server import app\n")
    assert [serving_breaks("ops", n) is not None for n, *_ in imports(tree)] == [True]
