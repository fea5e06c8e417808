"""Spot a notebook's attempts to reach into the grader, so that the report can name them, and graded
functions that hand their exercise to the course's own answer (calls_reference: a zero for it).

Read from the cells' sources (parsed, not run). The notes change no grade: the grade is computed
outside the notebook's process, where none of this reaches.
"""

from __future__ import annotations

import ast

NOTEBOOK_API = {"check", "exercises_for_lab"}  # what a notebook may import from specdec.grading
FRAME_ACCESS = {("sys", "_getframe"), ("inspect", "currentframe"), ("inspect", "stack"), ("gc", "get_objects"),
                ("gc", "get_referrers")}
NOTE = "has no effect on the grade (noted for the instructor)"


def specdec_names(tree: ast.AST) -> set[str]:
    """Names the cell binds to specdec modules or objects (`from specdec.sim import verify`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "specdec"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "specdec":
            names |= {a.asname or a.name for a in node.names}
    return names


def attempts(tree: ast.AST) -> list[str]:
    found, patches = [], []
    patched = specdec_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec.grading"):
            if node.module != "specdec.grading" or {a.name for a in node.names} - NOTEBOOK_API:
                found.append("imports the grader's internals")
        elif isinstance(node, ast.Import) and any(a.name.startswith("specdec.grading.") for a in node.names):
            found.append("imports the grader's internals")
        elif isinstance(node, ast.Import) and any(a.name == "ctypes" for a in node.names):
            found.append("uses ctypes")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in patched:
                    patches.append(f"{t.value.id}.{t.attr}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in FRAME_ACCESS:
                found.append(f"reads the interpreter's frames or objects ({node.value.id}.{node.attr})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "/proc/" in node.value:
            found.append("reads /proc")
    if patches:
        found.append(f"patches specdec ({', '.join(dict.fromkeys(patches))})")
    return list(dict.fromkeys(found))


def parse(source: str) -> ast.Module | None:
    lines = ("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())  # IPython magics
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):  # reported as the cell's error
        return None


def reaches_into_grader(source: str) -> str | None:
    """What in a cell looks like an attempt on the grader, as one note, or None."""
    tree = parse(source)
    found = attempts(tree) if tree else []
    return f"{'; '.join(found)}: this {NOTE}" if found else None


IMPORTERS = {"__import__", "importlib", "import_module"}


def reference_in(node: ast.AST, names: set[str], own: dict[str, ast.AST]) -> str | None:
    """How `node` reaches one of the functions `names` (or imports one by a name in a string), or None."""
    if isinstance(node, ast.Attribute) and (node.attr in names or node.attr in IMPORTERS):
        return f"`.{node.attr}`"
    if isinstance(node, ast.Name) and (node.id in IMPORTERS or node.id in names and node.id not in own):
        return f"`{node.id}`"
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        if any(m.startswith("specdec.grading") for m in modules) or any(a.name in names for a in node.names):
            return "an import"
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in names or "specdec" in node.value or node.value == "grading":
            return f"the string {node.value[:60]!r}"
    return None


def calls_reference(sources: list[str], name: str, references: list[str]) -> str | None:
    """How the notebook's function `name`, or a function of the notebook's that it calls, reaches the course's
    answers `references` ("module:function"), read from the source; None if it does not seem to."""
    own: dict[str, ast.AST] = {}
    for tree in filter(None, map(parse, sources)):
        own.update((n.name, n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    names = {path.partition(":")[2].split(".")[-1] for path in references}
    todo, seen = [name], set()
    while todo:
        fn = todo.pop()
        if fn in seen or fn not in own:
            continue
        seen.add(fn)
        for node in ast.walk(own[fn]):
            how = reference_in(node, names, own)
            if how:
                return f"through {how} in `{fn}`"
            if isinstance(node, ast.Name) and node.id in own:
                todo.append(node.id)
    return None
