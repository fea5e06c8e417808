"""Which directories a model argument names: a local Hugging Face directory (and the helper parts beside
it) or a hub id. No torch here, so that the launcher and the room can check a model before any server
imports it."""

from __future__ import annotations

from pathlib import Path


class ModelNotFound(Exception):
    """The model argument names nothing loadable; the message says what was tried."""


def model_paths(spec: str | Path, draft: str | Path | None = None) -> dict[str, Path]:
    """A local directory -> its target (plus siblings named draft/heads/eagle when it is itself
    named `target`); otherwise a Hugging Face id, downloaded only when online."""
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelNotFound(f"{p} has no config.json: not a Hugging Face model directory")
        paths = {"target": p}
        if p.name == "target":
            paths.update({part: p.parent / part for part in ("draft", "heads", "eagle")
                          if (p.parent / part / "config.json").is_file()})
    elif isinstance(spec, str) and spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        paths = {"target": _download(spec)}
    else:
        raise ModelNotFound(f"unknown model {str(spec)!r}: not a directory or a Hugging Face id")
    if draft:  # an explicit draft replaces the one found beside the target
        paths["draft"] = model_paths(draft)["target"]
    return paths


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download  # optional: only for hub ids
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.jinja"]))
    except Exception as exc:  # offline, missing repo, gated model: one clear line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ModelNotFound(f"could not fetch Hugging Face model {repo_id!r}: {type(exc).__name__}: {first}") from None
