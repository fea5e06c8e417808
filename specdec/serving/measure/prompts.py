"""The benchmark's prompts, by category, committed so that no download is needed.

predictable: counting, weekdays, months, letters (a draft should guess most tokens);
code: openings of Python functions and classes in the style of the standard library;
open: prose openings about Python and computing (the hardest to guess);
grounded: a passage, then the start of a copy of it (an edit or a quote: the answer repeats text that is in the
prompt, where a drafter that looks the prompt up, NGRAM, has its niche). Built from the code and open prompts
above, so every machine builds the same ones with nothing to download.
"""

from __future__ import annotations

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def _predictable() -> list[str]:
    out = []
    for start, step in ((1, 1), (7, 1), (40, 1), (100, 1), (2, 2), (5, 5), (10, 10), (3, 3)):
        out.append(", ".join(str(start + step * i) for i in range(8)) + ",")
    for start in range(7):
        out.append(", ".join(WEEKDAYS[(start + i) % 7] for i in range(5)) + ",")
    for start in (0, 2, 5, 8, 10):
        out.append(", ".join(MONTHS[(start + i) % 12] for i in range(5)) + ",")
    out += ["a b c d e f g h", "A, B, C, D, E, F,", "one, two, three, four, five,", "x1 = 1\nx2 = 2\nx3 = 3\nx4 = 4\n",
            "1\n2\n3\n4\n5\n", "item_0, item_1, item_2, item_3,", "0x00, 0x01, 0x02, 0x03, 0x04,",
            "January 1, January 2, January 3,", "Step 1. Step 2. Step 3.", "10 9 8 7 6 5"]
    return out


CODE = [
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Queue:\n    def __init__(self, maxsize=0):\n        self.",
    "def read_config(path):\n    \"\"\"Read a config file and return a dict.\"\"\"\n",
    "def _check_int(value, name):\n    if not isinstance(value, int):\n        raise TypeError(",
    "class Counter(dict):\n    def __missing__(self, key):\n        ",
    "def walk(top):\n    for name in os.listdir(top):\n        path = os.path.join(top, name)\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, ",
    "def copyfile(src, dst, *, follow_symlinks=True):\n    with open(src, 'rb') as fsrc:\n",
    "try:\n    import _thread\nexcept ImportError:\n    ",
    "def _splitext(p, sep, altsep, extsep):\n    sepIndex = p.rfind(sep)\n",
    "class Error(Exception):\n    \"\"\"Base class for errors in this module.\"\"\"\n\n\nclass ",
    "    def close(self):\n        if self._file is not None:\n            ",
    "def dumps(obj, *, indent=None):\n    \"\"\"Serialize obj to a string.\"\"\"\n    ",
    "__all__ = ['open', 'close', 'read', 'write',",
    "def isdir(s):\n    try:\n        st = os.stat(s)\n    except (OSError, ValueError):\n",
    "    @property\n    def name(self):\n        ",
    "if __name__ == '__main__':\n    ",
    "def _get_default_timeout():\n    global _default_timeout\n",
    "class Request:\n    def __init__(self, url, data=None, headers={}):\n",
    "    for i, line in enumerate(lines):\n        if not line.strip():\n",
    "def parse_args(args=None):\n    parser = argparse.ArgumentParser(",
    "    def __enter__(self):\n        return self\n\n    def __exit__(self, ",
    "def getattr_static(obj, attr, default=_sentinel):\n    ",
    "import re\n\n_pattern = re.compile(r'",
    "    def __len__(self):\n        return len(self.",
    "def _format_time(seconds):\n    minutes, seconds = divmod(seconds, 60)\n",
    "    except KeyError:\n        raise AttributeError(",
    "class Timer:\n    \"\"\"Measure elapsed time.\"\"\"\n\n    def __init__(self",
    "def quote(s):\n    \"\"\"Return a shell-escaped version of the string s.\"\"\"\n",
    "with open(filename, encoding='utf-8') as f:\n    for line in f:\n",
]

OPEN = [
    "The with statement is used to",
    "A generator is a function that",
    "When an exception is raised inside a try clause,",
    "Names in Python refer to objects, and",
    "The garbage collector reclaims memory when",
    "A module can contain executable statements as well as",
    "Decorators are a convenient way to",
    "The global interpreter lock means that",
    "Floating point numbers are represented in hardware as",
    "An iterator is an object that",
    "The import system first searches",
    "Keyword arguments make a call easier to read because",
    "A class definition creates a new namespace in which",
    "Unicode strings are sequences of code points, and",
    "The standard library provides modules for",
    "A context manager is responsible for",
    "Comparisons can be chained, so that",
    "The difference between a list and a tuple is",
    "Virtual environments let each project",
    "A lambda expression creates a small anonymous function that",
    "Dictionaries preserve insertion order, which means",
    "Threads share memory, so two threads that",
    "A coroutine differs from an ordinary function in that",
    "The data model describes how objects",
    "Slicing a sequence returns a new object that",
    "Integers in Python have arbitrary precision, so",
    "Type hints are not enforced at run time, but",
    "The interactive interpreter evaluates each expression and",
    "An abstract base class defines an interface that",
    "When a function is called, its arguments are",
]



def _grounded() -> list[str]:
    """A passage of two committed prompts, then a copy of it begun: the rest of the answer is in the prompt."""
    out = []
    for i, first in enumerate(CODE[:15]):
        passage = (first + CODE[(i + 7) % len(CODE)]).rstrip()
        out.append(f"{passage}\n\n# the same code, unchanged:\n{passage.splitlines()[0]}\n")
    for i, first in enumerate(OPEN[:15]):
        passage = f"{first} ... {OPEN[(i + 11) % len(OPEN)]} ..."
        head = " ".join(passage.split()[:3])
        out.append(f"Text: {passage}\nThe same text, quoted exactly: {head}")
    return out


PROMPTS: dict[str, list[str]] = {"predictable": _predictable(), "code": CODE, "open": OPEN, "grounded": _grounded()}
CATEGORIES = tuple(PROMPTS)
# what a sweep runs unless told: grounded is asked for by name (the lecture runs it apart), so that a default sweep
# takes no longer than before it existed
DEFAULT_CATEGORIES = ("predictable", "code", "open")


def prompts(category: str) -> list[str]:
    """The prompts of one category (predictable, code, open, grounded)."""
    if category not in PROMPTS:
        raise ValueError(f"unknown prompt category {category!r}; choose from {', '.join(CATEGORIES)}")
    return PROMPTS[category]
