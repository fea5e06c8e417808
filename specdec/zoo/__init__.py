"""The embedded model zoo: a tiny MiMo-layout target with its MTP layer, a draft, parallel MTP heads
and an EAGLE head, trained by the project and stored in Hugging Face format."""

from specdec.zoo.registry import ZooError, find_zoo, zoo_parts

__all__ = ["ZooError", "find_zoo", "zoo_parts"]
