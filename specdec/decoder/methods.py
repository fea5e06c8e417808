"""Every decoding method, once: the course's name, the labs' label, the bundle part it needs and
SGLang's name for it. The CLI, the launcher, the zoo and the bundle all read this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str  # the course's name: --method on `specdec decode`, specdec serve's algorithm
    label: str  # as the labs say it
    part: str | None  # the ModelBundle attribute (and zoo part) its proposer needs; None: nothing to load
    sglang: str  # SGLang's --speculative-algorithm ("none": plain decoding)

    @property
    def reported(self) -> str | None:
        """The algorithm SGLang's /server_info names for it (None: plain decoding). SGLang resolves NEXTN to EAGLE
        when it starts (0.5.16: the MTP layer is drafted by the EAGLE worker), so a NEXTN server reports EAGLE."""
        if self.name == "ar":
            return None
        return "EAGLE" if self.sglang == "NEXTN" else self.sglang

    @property
    def parts(self) -> tuple[str, ...]:
        """What load_bundle must load besides the target for this method."""
        return (self.part,) if self.part else ()


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "plain", None, "none"),
    Method("mtp", "MTP layer", "mtp", "NEXTN"),  # the target's own MTP layer
    Method("heads", "MTP heads", "heads", "HEADS"),
    Method("draft", "draft model", "draft", "STANDALONE"),
    Method("eagle", "EAGLE head", "eagle", "EAGLE"),
    Method("ngram", "n-gram", None, "NGRAM"),
)}
PARTS = tuple(m.part for m in METHODS.values() if m.part)  # what a bundle may carry besides its target
LABELS = {m.name: m.label for m in METHODS.values()}
# SGLang's names and the other spellings a student may use, lower-case -> the course's name
SPELLINGS = {**{m.sglang.lower(): m.name for m in METHODS.values()}, **{m.name: m.name for m in METHODS.values()},
             "plain": "ar"}


def method_named(spelling: str) -> Method:
    """The method a name stands for, in the course's or SGLang's spelling (any case): ValueError if none."""
    name = SPELLINGS.get(str(spelling).lower())
    if name is None:
        raise ValueError(f"unknown method {spelling!r}; choose from {', '.join(METHODS)} "
                         f"(or SGLang's {', '.join(m.sglang for m in METHODS.values())})")
    return METHODS[name]
