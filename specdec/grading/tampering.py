"""Spot a notebook's attempts to reach into the grader, so that the report can name them.

Only a note for the instructor: the grade is computed outside the notebook's process, where none
of this reaches. Read from the cells' sources (parsed, not run).
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


def reaches_into_grader(source: str) -> str | None:
    """What in a cell looks like an attempt on the grader, as one note, or None."""
    lines = ("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())  # IPython magics
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):  # reported as the cell's error
        return None
    found = attempts(tree)
    return f"{'; '.join(found)}: this {NOTE}" if found else None
