"""The embedded model zoo: a tiny MiMo-layout target with its MTP layer, a draft, parallel MTP heads
and an EAGLE head, trained by the project and stored in Hugging Face format.

`load_bundle("tiny")` resolves a zoo name to its directories; a directory or hub id passes through
to specdec.decoder.bundle, which never knows about zoo names.
"""

from __future__ import annotations

import importlib
from typing import Any

from specdec.decoder.paths import ModelNotFound
from specdec.zoo.registry import ZooError, find_zoo, known_zoos, rebuild_hint, resolve, zoo_parts

__all__ = ["ModelNotFound", "ZooError", "find_zoo", "load_bundle", "resolve", "zoo_parts"]
# The loading side imports torch: imported when first asked for (as specdec/__init__.py does), so that zoo_parts,
# which Lab 3's notebook imports in every kernel that grades it, and resolve, which the launcher and the room
# check a model with, cost no torch.
_WHERE = {"load_bundle": "specdec.zoo.load", "ModelBundle": "specdec.decoder.bundle"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'specdec.zoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
