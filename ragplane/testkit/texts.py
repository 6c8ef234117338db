"""Real English text available offline: CPython's pydoc topics and stdlib docstrings.

Deterministic (sorted sources, no randomness), so tests and benchmarks see the same
passages on every machine with the same Python.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
import warnings

# Modules never imported for their docstrings (GUI, side effects, test suites).
_SKIP = frozenset(
    {
        "antigravity",
        "this",
        "idlelib",
        "tkinter",
        "turtle",
        "turtledemo",
        "test",
        "lib2to3",
        "ensurepip",
        "venv",
        "pydoc",
        "webbrowser",
        "__main__",
        "xxlimited",
        "xxsubtype",
    }
)


@functools.cache
def topic_passages(max_words: int = 120, min_words: int = 8) -> tuple[str, ...]:
    """pydoc_data.topics split into paragraphs, long ones cut into chunks of max_words."""
    from pydoc_data.topics import topics

    out: list[str] = []
    for key in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[key]):
            words = para.split()
            for i in range(0, len(words), max_words):
                chunk = words[i : i + max_words]
                if len(chunk) >= min_words:
                    out.append(" ".join(chunk))
    return tuple(dict.fromkeys(out))  # unique, order kept


@functools.cache
def docstrings(min_words: int = 5) -> tuple[str, ...]:
    """Paragraphs of the docstrings of the standard library's public modules, functions,
    classes and methods (about 7,000 unique on CPython 3.11)."""
    out: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(sys.stdlib_module_names):
            if name in _SKIP or name.startswith("_"):
                continue
            try:
                mod = importlib.import_module(name)
            except Exception:  # platform-specific modules
                continue
            objs: list[object] = [mod]
            for attr in sorted(dir(mod)):
                if attr.startswith("_"):
                    continue
                obj = getattr(mod, attr, None)
                objs.append(obj)
                if inspect.isclass(obj) and getattr(obj, "__module__", "") == mod.__name__:
                    objs += [getattr(obj, m, None) for m in sorted(vars(obj)) if m[0] != "_"]
            for obj in objs:
                doc = inspect.getdoc(obj) if obj is not None else None
                for para in (doc or "").split("\n\n"):
                    text = " ".join(para.split())
                    if len(text.split()) >= min_words:
                        out.append(text)
    return tuple(dict.fromkeys(out))


def long_passages(min_words: int = 200) -> list[str]:
    """Whole topics long enough to pass 128 (and many 256) tokens."""
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        words = topics[key].split()
        if len(words) >= min_words:
            out.append(" ".join(words[: min_words + (len(out) % 5) * 60]))
    return out


@functools.cache
def sentences(min_words: int = 5) -> tuple[str, ...]:
    """Sentences of pydoc_data.topics (about 9,000 unique)."""
    from pydoc_data.topics import topics

    out: list[str] = []
    for key in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[key]):
            for sent in re.split(r"(?<=[.!?])\s+", " ".join(para.split())):
                if len(sent.split()) >= min_words:
                    out.append(sent)
    return tuple(dict.fromkeys(out))


def corpus(n: int) -> list[str]:
    """n distinct real passages: topic passages, docstrings, then sentences."""
    pool = list(dict.fromkeys([*topic_passages(), *docstrings(), *sentences()]))
    if len(pool) < n:
        raise ValueError(f"only {len(pool)} real passages available, {n} asked")
    return pool[:n]
