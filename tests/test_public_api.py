"""One public API: the notebooks import every name from `specdec` itself, each listed in its __all__,
and `import specdec` stays light (a name's module is imported when the name is first asked for)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import specdec

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "labs") for p in (ROOT / d).glob("*.ipynb"))
DEEP_IMPORT = re.compile(r"^\s*(from specdec\.[\w.]+ import|import specdec\.)", re.M)


def code_of(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebooks_import_only_from_specdec(path):
    code = code_of(path)
    assert not DEEP_IMPORT.findall(code), f"{path.name} imports from a specdec submodule"
    for line in re.findall(r"^from specdec import \(?([^)]*?)\)?$", code, re.M | re.S):
        for name in re.split(r"[,\s]+", line.strip()):
            assert not name or name in specdec.__all__, f"{name} is not in specdec.__all__"


def test_every_public_name_resolves():
    for name in specdec.__all__:
        assert getattr(specdec, name) is not None
    assert set(specdec.__all__) <= set(dir(specdec))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        specdec.nope  # noqa: B018


def test_importing_specdec_imports_no_heavy_module():
    code = "import sys, specdec; print(sorted(m for m in ('torch', 'numpy', 'fastapi', 'IPython') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
