"""environment.yml (the course's conda environment) and pyproject.toml name the same packages."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def names(specs):
    return {re.split(r"[<>=!~ \[]", s.strip(), maxsplit=1)[0].lower().replace("_", "-") for s in specs}


def conda_packages() -> dict[str, str]:
    """name -> spec of every dependency line (conda and pip), from a plain reading of the YAML."""
    out = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+)(.*)$", line)
        if m and m.group(1) not in ("pip", "e", "conda-forge") and not line.strip().startswith("- -e"):
            out[m.group(1).lower().replace("_", "-")] = m.group(2).strip()
    return out


def test_every_pyproject_dependency_is_in_the_conda_environment():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = names(project["dependencies"]) | names(project["optional-dependencies"]["dev"])
    have = conda_packages()
    assert wanted - set(have) == set(), f"missing from environment.yml: {sorted(wanted - set(have))}"


def test_versions_agree_and_torch_is_pinned_as_the_makefile_pins_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    have = conda_packages()
    for spec in project["dependencies"] + project["optional-dependencies"]["dev"]:
        name = next(iter(names([spec])))
        lower = re.search(r">=\s*([0-9.]+)", spec)
        if lower and name != "torch":
            assert f">={lower.group(1)}" in have[name].replace(" ", ""), f"{name}: {spec} vs environment.yml {have[name]}"
    pin = re.search(r"TORCH\s*\?=\s*torch==([0-9.]+)", (ROOT / "Makefile").read_text()).group(1)
    assert have["torch"] == f"=={pin}"
    assert "python=3.11" in (ROOT / "environment.yml").read_text()
