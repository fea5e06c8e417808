"""One method table (specdec/decoder/methods.py) that the engine, the bundle, specdec serve, the launcher
and the zoo read: every spelling a student may type names one method, the same one everywhere."""

from __future__ import annotations

import pytest

from specdec.decoder import bundle, engine
from specdec.decoder.methods import METHODS, PARTS, method_named
from specdec.serving.ops import launch


@pytest.mark.parametrize("spelling, name", [("ar", "ar"), ("none", "ar"), ("plain", "ar"), ("MTP", "mtp"),
                                            ("NEXTN", "mtp"), ("nextn", "mtp"), ("STANDALONE", "draft"),
                                            ("draft", "draft"), ("EAGLE", "eagle"), ("heads", "heads"),
                                            ("NGRAM", "ngram")])
def test_every_spelling_names_one_method(spelling, name):
    assert method_named(spelling).name == name
    assert launch.SPECDEC_NAMES[launch.ALIASES[spelling.lower()]] == ("none" if name == "ar" else name)


def test_an_unknown_method_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown method 'medusa'; choose from ar, mtp"):
        method_named("medusa")


def test_the_bundle_and_the_engine_read_the_table():
    assert bundle.PARTS == PARTS == ("mtp", "heads", "draft", "eagle")
    assert all(getattr(bundle.ModelBundle, "__dataclass_fields__")[m.part] for m in METHODS.values() if m.part)
    with pytest.raises(ValueError, match="unknown method"):
        engine.make_proposer("medusa", None)
