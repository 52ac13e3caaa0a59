"""Fleet selectors (DESIGN §12): which Hands one `mind exec --hands SELECTOR` names.

Pure: the Mind resolves a selector over its own credential table (names and the labels the operator
set with `mind hand label`), never over what a Hand claims about itself, so a compromised Hand
cannot attract commands by claiming `role=web`.

Grammar (no quoting needed: every character is one a Hand's name or a label may hold):

    selector := term ("," term)*          a Hand matches if it matches ANY term (union)
    term     := atom ("+" atom)*          ... and matches a term if it matches EVERY atom (intersection)
    atom     := KEY "=" VALUE             the operator's label KEY has the value VALUE (a glob)
              | NAME                      the Hand's name, or a glob over names (`web*`, `*`, `db[12]`)

So `web1,web2` is a list, `web*` a glob, `role=web` a label, `role=web+dc=eu1` the web Hands in
eu1, and `role=web+dc=eu1,db1` those plus db1. Glob characters are fnmatch's `* ? [ ] !`,
case-sensitive.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from functools import lru_cache

from protocol import limits
from protocol.errors import MindhandError

_GLOB = re.compile(r"^[A-Za-z0-9._*?\[\]!-]{1,128}$")
MAX_SELECTOR_CHARS = 4096
MAX_PATTERN_ATOMS = 16
"""Globs and labels one selector may hold, after duplicates are dropped (issue 23, attack 3: one
4 KiB selector of 2,048 atoms against 10,000 Hands held the Mind's loop 14 s). A plain name is not
counted: it is looked up by key, so a list of names costs one set lookup per Hand however long it
is; every other atom is tried against every Hand, so their number is what bounds a selection."""


class SelectorError(MindhandError):
    """A selector that does not parse: the message names the part that is wrong."""


def _plain(pattern: str) -> bool:
    return limits.LABEL_RE.fullmatch(pattern) is not None


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Callable[[str], object]:
    return re.compile(translate(pattern)).match


@dataclass(frozen=True)
class Atom:
    pattern: str
    key: str | None = None
    """None: `pattern` is over the Hand's name; else over the value of label `key`."""

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        value = name if self.key is None else labels.get(self.key)
        return value is not None and _compiled(self.pattern)(value) is not None


@dataclass(frozen=True)
class Selector:
    text: str
    terms: tuple[tuple[Atom, ...], ...]
    """Each term once, each atom once in its term, in the order first written."""
    _names: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    """The terms that are one plain name: matched by a set lookup."""
    _name_globs: object = field(default=None, compare=False, repr=False)
    """The terms that are one glob over names, as one compiled alternation (or None)."""
    _rest: tuple[tuple[tuple[str | None, Callable[[str], object]], ...], ...] = field(
        default=(), compare=False, repr=False
    )
    """The other terms, each as (label key or None for the name, compiled pattern) pairs."""

    def __post_init__(self) -> None:
        names: set[str] = set()
        globs: list[str] = []
        rest = []
        for term in self.terms:
            if len(term) == 1 and term[0].key is None:
                if _plain(term[0].pattern):
                    names.add(term[0].pattern)
                else:
                    globs.append(term[0].pattern)
            else:
                rest.append(tuple((a.key, _compiled(a.pattern)) for a in term))
        object.__setattr__(self, "_names", frozenset(names))
        alternation = re.compile("|".join(f"(?:{translate(g)})" for g in globs)).match if globs else None
        object.__setattr__(self, "_name_globs", alternation)
        object.__setattr__(self, "_rest", tuple(rest))

    @property
    def needs_labels(self) -> bool:
        """Whether matching reads labels: if not, a caller need not decode them for every Hand."""
        return any(key is not None for term in self._rest for key, _ in term)

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if name in self._names:
            return True
        globs = self._name_globs
        if globs is not None and callable(globs) and globs(name) is not None:
            return True
        for term in self._rest:  # the hot loop of a selection: no generator per Hand
            for key, match in term:
                value = name if key is None else labels.get(key)
                if value is None or match(value) is None:
                    break
            else:
                return True
        return False

    def select(self, hands: Iterable[tuple[str, Mapping[str, str]]]) -> list[str]:
        """The names of `hands` (name, labels) that match, in the order given."""
        return [name for name, labels in hands if self.matches(name, labels)]

    @property
    def names_only(self) -> tuple[str, ...] | None:
        """The plain names if the selector is just a list of names (no globs, no labels): a
        caller may then report each unknown name."""
        out = []
        for term in self.terms:
            if len(term) != 1 or term[0].key is not None or not _plain(term[0].pattern):
                return None
            out.append(term[0].pattern)
        return tuple(out)


def parse(text: str) -> Selector:
    """Parse, dropping repeated terms and repeated atoms within a term (they change nothing that
    matches), then bound the atoms that cost a match per Hand (`MAX_PATTERN_ATOMS`)."""
    if not text or not text.strip():
        raise SelectorError("empty selector: give names, globs (web*) or labels (role=web)")
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_CHARS} characters")
    terms: dict[frozenset[Atom], tuple[Atom, ...]] = {}
    for raw_term in text.split(","):
        term = raw_term.strip()
        if not term:
            raise SelectorError(f"empty term in selector {text!r} (two commas, or a trailing one)")
        atoms: dict[Atom, None] = {}
        for raw_atom in term.split("+"):
            atoms.setdefault(_atom(raw_atom.strip(), text))
        terms.setdefault(frozenset(atoms), tuple(atoms))  # `a+b` and `b+a` are one term
    costly = sum(len(t) for t in terms.values() if len(t) > 1 or t[0].key is not None or not _plain(t[0].pattern))
    if costly > MAX_PATTERN_ATOMS:
        raise SelectorError(
            f"selector holds {costly} globs or labels (at most {MAX_PATTERN_ATOMS}): "
            "list plain names, or use a label the Hands share"
        )
    return Selector(text, tuple(terms.values()))


def _atom(atom: str, text: str) -> Atom:
    if not atom:
        raise SelectorError(f"empty part in {text!r} (a '+' with nothing on one side)")
    key, eq, value = atom.partition("=")
    if eq:
        if not limits.LABEL_RE.fullmatch(key):
            raise SelectorError(f"{atom!r}: label key {key!r} is not a name (A-Z a-z 0-9 . _ -)")
        if not _GLOB.fullmatch(value):
            raise SelectorError(f"{atom!r}: label value {value!r} is not a value or glob")
        return Atom(value, key)
    if not _GLOB.fullmatch(atom):
        raise SelectorError(f"{atom!r} is not a Hand name, glob (web*) or label (role=web)")
    return Atom(atom)


def parse_label(item: str) -> tuple[str, str]:
    """`key=value` as `mind hand add --label` and `mind hand label` take it."""
    key, eq, value = item.partition("=")
    if not eq or not limits.LABEL_RE.fullmatch(key) or not limits.LABEL_VALUE_RE.fullmatch(value):
        raise SelectorError(f"label {item!r}: want key=value, each 1-64 of A-Z a-z 0-9 . _ - (not starting with . _ -)")
    return key, value


def parse_label_edits(items: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """`mind hand label NAME k=v -k k-`: what to set and which keys to remove (`-k` or `k-`, as
    `kubectl label` removes with `k-`)."""
    set_: dict[str, str] = {}
    remove: list[str] = []
    for item in items:
        if "=" not in item and (item.startswith("-") or item.endswith("-")):
            key = item[1:] if item.startswith("-") else item[:-1]
            if not limits.LABEL_RE.fullmatch(key):
                raise SelectorError(f"{item!r}: {key!r} is not a label key")
            remove.append(key)
        else:
            k, v = parse_label(item)
            set_[k] = v
    return set_, remove
