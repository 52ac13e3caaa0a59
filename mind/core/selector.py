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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from protocol import limits
from protocol.errors import MindhandError

_GLOB = re.compile(r"^[A-Za-z0-9._*?\[\]!-]{1,128}$")


class SelectorError(MindhandError):
    """A selector that does not parse: the message names the part that is wrong."""


@dataclass(frozen=True)
class Atom:
    pattern: str
    key: str | None = None
    """None: `pattern` is over the Hand's name; else over the value of label `key`."""

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.key is None:
            return fnmatchcase(name, self.pattern)
        value = labels.get(self.key)
        return value is not None and fnmatchcase(value, self.pattern)


@dataclass(frozen=True)
class Selector:
    text: str
    terms: tuple[tuple[Atom, ...], ...]

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        return any(all(a.matches(name, labels) for a in term) for term in self.terms)

    def select(self, hands: Iterable[tuple[str, Mapping[str, str]]]) -> list[str]:
        """The names of `hands` (name, labels) that match, in the order given."""
        return [name for name, labels in hands if self.matches(name, labels)]

    @property
    def names_only(self) -> tuple[str, ...] | None:
        """The plain names if the selector is just a list of names (no globs, no labels): a
        caller may then report each unknown name."""
        out = []
        for term in self.terms:
            if len(term) != 1 or term[0].key is not None or not limits.LABEL_RE.fullmatch(term[0].pattern):
                return None
            out.append(term[0].pattern)
        return tuple(out)


def parse(text: str) -> Selector:
    if not text or not text.strip():
        raise SelectorError("empty selector: give names, globs (web*) or labels (role=web)")
    if len(text) > 4096:
        raise SelectorError("selector longer than 4096 characters")
    terms = []
    for raw_term in text.split(","):
        term = raw_term.strip()
        if not term:
            raise SelectorError(f"empty term in selector {text!r} (two commas, or a trailing one)")
        atoms = []
        for raw_atom in term.split("+"):
            atoms.append(_atom(raw_atom.strip(), text))
        terms.append(tuple(atoms))
    return Selector(text, tuple(terms))


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
