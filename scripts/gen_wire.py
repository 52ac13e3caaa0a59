#!/usr/bin/env python3
"""Write mind/client/wire_gen.py, the fast path's payload checks, from protocol/messages.py.

`mind exec` reads a handful of message types without pydantic (mind/client/checks.py says why).
Its checks used to be written by hand "in step with" the models; now they are generated from the
models' own validation schemas (pydantic's core schema: the exact rules pydantic applies), so the
contract is written once. The generator knows a small vocabulary (strict str/int/bytes/bool, float,
enum, literal, optional, any, nested models, defaults, and the model validators named in
`mind.client.checks.RULES`) and refuses anything else, naming the field: a new kind of constraint
fails here instead of being silently skipped.

    scripts/gen_wire.py            rewrite mind/client/wire_gen.py
    scripts/gen_wire.py --check    exit 1 (with a diff) if the checked-in file differs from what the
                                   models produce now; exit 2 if the models use something this
                                   generator cannot translate
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import inspect
import re
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # appended: a PYTHONPATH given by the caller (a test's copy) comes first

OUT = ROOT / "mind" / "client" / "wire_gen.py"

# What the fast path (mind/client/blocking.py, mind/cli/exec.py) receives, and what it sends.
INBOUND = (
    "challenge",
    "welcome",
    "error",
    "run_update",
    "run_output",
    "stream_numbers",
    "stream_ack",
    "run_end",
    "cancel_run_result",
    "stream_resume",
    "attached",
    "replaced",
    "detached",
)
OUTBOUND = ("hello", "proof", "exec", "cancel_run", "stream_ack", "resize", "attach", "detach")
# `stream_data` is not an envelope (a data frame, protocol/frames.py): mind/client/wire.py builds it.


class Unsupported(Exception):
    """The models use something the fast path's checks cannot express (yet)."""


def _allow(schema: dict[str, Any], where: str, keys: set[str]) -> None:
    extra = set(schema) - keys - {"type", "metadata", "ref"}
    if extra:
        raise Unsupported(
            f"{where}: {schema['type']} schema with {sorted(extra)} is not supported by scripts/gen_wire.py"
        )


def py(value: Any) -> str:
    """A Python literal as `ruff format` writes it (double quotes)."""
    if isinstance(value, (str, bytes)):
        text = repr(value)
        prefix = "b" if isinstance(value, bytes) else ""
        body = text[len(prefix) + 1 : -1]
        if text[len(prefix)] == "'" and '"' not in body and "\\'" not in body:
            return f'{prefix}"{body}"'
        return text
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    raise Unsupported(f"a default of type {type(value).__name__} is not supported by scripts/gen_wire.py")


def kwargs(**items: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in items.items() if v is not None)


class Generator:
    def __init__(self, messages: Any, limits: Any, rules: dict[str, Any]) -> None:
        self.messages = messages
        self.rules = rules
        self.patterns = {v.pattern: f"limits.{k}" for k, v in vars(limits).items() if isinstance(v, re.Pattern)}
        self.imports: dict[str, set[str]] = {}
        self.helpers: set[str] = set()
        self.compiled: dict[str, str] = {}  # pattern -> name of a module-level re.compile
        self.nested: dict[str, str] = {}  # model class qualname -> name of its module-level check
        self.blocks: list[str] = []
        self.digests: dict[str, str] = {}
        self.defs: dict[str, dict[str, Any]] = {}

    def use(self, name: str) -> str:
        self.helpers.add(name)
        return name

    def need(self, module: str, name: str) -> str:
        self.imports.setdefault(module, set()).add(name)
        return name

    # --- schema -> check expression ---

    def check(self, s: dict[str, Any], where: str) -> str:
        t = s["type"]
        if t == "definitions":
            self.defs.update({d["ref"]: d for d in s["definitions"]})
            _allow(s, where, {"schema", "definitions"})
            return self.check(s["schema"], where)
        if t == "definition-ref":
            _allow(s, where, {"schema_ref"})
            return self.check(self.defs[s["schema_ref"]], where)
        if t == "str":
            _allow(s, where, {"strict", "max_length", "min_length", "pattern"})
            pattern = s.get("pattern")
            if pattern is not None:
                pattern = self.patterns.get(pattern) or self.regex(pattern)
            return f"{self.use('strict_str')}({kwargs(min_len=s.get('min_length'), max_len=s.get('max_length'), pattern=pattern)})"
        if t == "int":
            _allow(s, where, {"strict", "ge", "gt", "le", "lt"})
            return f"{self.use('strict_int')}({kwargs(**{k: s.get(k) for k in ('ge', 'gt', 'le', 'lt')})})"
        if t == "float":
            # `number` refuses NaN and infinities always; a model saying so too (allow_inf_nan=False) agrees
            _allow(s, where, {"strict", "ge", "gt", "le", "lt", "allow_inf_nan"})
            return f"{self.use('number')}({kwargs(**{k: s.get(k) for k in ('ge', 'gt', 'le', 'lt')})})"
        if t == "bool":
            _allow(s, where, {"strict"})
            return self.use("strict_bool")
        if t == "bytes":
            _allow(s, where, {"strict", "max_length", "min_length"})
            return f"{self.use('strict_bytes')}({kwargs(min_len=s.get('min_length'), max_len=s.get('max_length'))})"
        if t == "enum":
            _allow(s, where, {"cls", "members", "sub_type", "strict"})
            cls = s["cls"]
            if s.get("sub_type") != "str" or list(cls) != list(s["members"]):
                raise Unsupported(f"{where}: only str enums with all their members are supported")
            return f"{self.use('enum')}({self.need(cls.__module__, cls.__qualname__)})"
        if t == "literal":
            _allow(s, where, {"expected"})
            if not all(isinstance(x, str) for x in s["expected"]):
                raise Unsupported(f"{where}: only literals of strings are supported")
            return f"{self.use('literal')}({', '.join(py(x) for x in s['expected'])})"
        if t == "nullable":
            _allow(s, where, {"schema", "strict"})
            return f"{self.use('optional')}({self.check(s['schema'], where)})"
        if t == "any":
            _allow(s, where, set())
            return self.use("any_value")
        if t == "list":
            _allow(s, where, {"items_schema", "max_length", "min_length", "strict"})
            inner = self.check(s["items_schema"], f"{where}[]")
            bounds = kwargs(min_len=s.get("min_length"), max_len=s.get("max_length"))
            return f"{self.use('list_of')}({inner}{', ' + bounds if bounds else ''})"
        if t in ("model", "function-after"):
            return self.nested_model(s, where)
        raise Unsupported(f"{where}: a {t!r} schema is not supported by scripts/gen_wire.py")

    def regex(self, pattern: str) -> str:
        if pattern not in self.compiled:
            self.need("re", "")
            self.compiled[pattern] = f"_PATTERN_{len(self.compiled)}"
        return self.compiled[pattern]

    def model_parts(self, s: dict[str, Any], where: str) -> tuple[type, str, list[str], str | None]:
        """(model class, TYPE, field lines, rule expression) of a model schema."""
        rule = None
        while s["type"] == "definitions":
            _allow(s, where, {"schema", "definitions"})
            self.defs.update({d["ref"]: d for d in s["definitions"]})
            s = s["schema"]
        if s["type"] == "function-after":
            _allow(s, where, {"function", "schema"})
            fn = s["function"]
            if fn.get("type") != "no-info":
                raise Unsupported(f"{where}: only `mode='after'` model validators without info are supported")
            name = fn["function"].__qualname__
            if name not in self.rules:
                raise Unsupported(
                    f"{where}: the model validator {name} has no twin in mind.client.checks.RULES: write one"
                )
            self.digests[name] = _body_digest(fn["function"])
            rule = f"{self.use('RULES')}[{py(name)}]"
            s = s["schema"]
        if s["type"] != "model":
            raise Unsupported(f"{where}: a model wrapped in {s['type']!r} is not supported")
        _allow(s, where, {"cls", "config", "custom_init", "root_model", "schema", "post_init"})
        cls = s["cls"]
        config = s.get("config", {})
        if set(config) - {"title", "extra_fields_behavior", "strict", "frozen"}:
            raise Unsupported(f"{where}: model config {sorted(config)} is not supported")
        if config.get("extra_fields_behavior") != "forbid" or s.get("custom_init") or s.get("root_model"):
            raise Unsupported(f"{where}: only models with extra='forbid', no custom __init__, not root models")
        if s.get("post_init"):
            raise Unsupported(f"{where}: model_post_init is not supported")
        fields_schema = s["schema"]
        _allow(fields_schema, where, {"fields", "model_name", "computed_fields"})
        if fields_schema.get("computed_fields"):
            raise Unsupported(f"{where}: computed fields are not supported")
        lines = []
        for name, field in fields_schema["fields"].items():
            at = f"{where}.{name}"
            _allow(field, at, {"schema"})
            fs = field["schema"]
            default = self.use("REQUIRED")
            if fs["type"] == "default" and "default_factory" in fs:
                _allow(fs, at, {"schema", "default_factory", "default_factory_takes_data"})
                if fs["default_factory"] is not list or fs.get("default_factory_takes_data"):
                    raise Unsupported(f"{at}: only `default_factory=list` is supported")
                default = f"{self.use('Factory')}(list)"
                fs = fs["schema"]
            elif fs["type"] == "default":
                _allow(fs, at, {"schema", "default"})
                default = self.default(fs["default"], at)
                fs = fs["schema"]
            lines.append(f"{py(name)}: ({self.check(fs, at)}, {default}),")
        return cls, cls.TYPE, lines, rule

    def default(self, value: Any, where: str) -> str:
        import pydantic

        if isinstance(value, pydantic.BaseModel):
            fields = ", ".join(f"{py(k)}: {py(v)}" for k, v in value.model_dump(mode="python").items())
            return f"{self.use('Msg')}({py(cast(Any, value).TYPE)}, {{{fields}}})"
        try:
            return py(value)
        except Unsupported as exc:
            raise Unsupported(f"{where}: {exc}") from None

    def render_model(self, const: str, s: dict[str, Any], where: str) -> None:
        cls, type_, lines, rule = self.model_parts(s, where)
        body = "\n".join(f"        {ln}" for ln in lines)
        tail = f"\n    rule={rule}," if rule else ""
        self.blocks.append(f"{const} = {self.use('model')}(\n    {py(type_)},\n    {{\n{body}\n    }},{tail}\n)")

    def nested_model(self, s: dict[str, Any], where: str) -> str:
        cls = (s["schema"] if s["type"] == "function-after" else s)["cls"]
        if cls.__qualname__ not in self.nested:
            const = _const(cls.TYPE)
            self.nested[cls.__qualname__] = const
            self.render_model(const, s, where)
        return self.nested[cls.__qualname__]

    # --- outgoing messages: field order and defaults as the model's `model_dump` ---

    def builder(self, model: Any) -> str:
        name = model.TYPE + ("_" if model.TYPE in ("exec", "import", "from") else "")
        params, items = [], []
        for field, info in model.model_fields.items():
            if info.is_required():
                params.append(f"    {field}: Any,")
            elif info.default_factory is list:  # a fresh list each time, as the model makes it
                params.append(f"    {field}: Any = None,")
                items.append(f"            {py(field)}: [] if {field} is None else {field},")
                continue
            else:
                params.append(
                    f"    {field}: Any = {self.default(info.get_default(call_default_factory=False), model.TYPE)},"
                )
            items.append(f"            {py(field)}: {field},")
        doc = f'    """`{model.TYPE}`, as `protocol.messages.{model.__qualname__}(...).model_dump()` holds it."""'
        return (
            f"def {name}(\n    *,\n" + "\n".join(params) + "\n) -> Msg:\n" + doc + "\n"
            f"    return Msg(\n        {py(model.TYPE)},\n        {{\n" + "\n".join(items) + "\n        },\n    )"
        )

    def render(self) -> str:
        m = self.messages
        m.build_all()
        for t in INBOUND:
            model = m.MESSAGE_TYPES[t]
            self.defs = {}
            self.render_model(_const(t), model.__pydantic_core_schema__, t)
        builders = [self.builder(m.MESSAGE_TYPES[t]) for t in OUTBOUND]
        self.use("Msg")
        head = [
            '"""Generated by scripts/gen_wire.py from protocol/messages.py: do not edit.',
            "",
            "The payload checks of the message types `mind exec`'s fast path receives, and builders for the ones",
            "it sends, from the models' validation schemas (mind/client/checks.py says why they exist).",
            "`scripts/gen_wire.py --check` fails when this file differs from what the models produce.",
            '"""',
            "",
            "from __future__ import annotations",
            "",
        ]
        if "re" in self.imports:
            head += ["import re"]
        head += ["from typing import Any", ""]
        ours = {"mind.client.checks": self.helpers, **{k: v for k, v in self.imports.items() if k != "re"}}
        if any("limits." in b for b in self.blocks):
            ours["protocol"] = {"limits"}
        for module in sorted(ours):
            names = sorted(ours[module], key=_isort_key)
            line = f"from {module} import {', '.join(names)}"
            head += [line] if len(line) <= 120 else [f"from {module} import (", *(f"    {n}," for n in names), ")"]
        out = "\n".join(head) + "\n"
        if self.compiled:
            out += "\n" + "\n".join(f"{v} = re.compile({py(k)})" for k, v in self.compiled.items()) + "\n"
        out += "\n# a digest of the body of each model validator a twin in `checks.RULES` mirrors: a change fails --check\n"
        digests = "".join(f"    {py(k)}: {py(v)},\n" for k, v in sorted(self.digests.items()))
        out += f"VALIDATORS = {{\n{digests}}}\n" if digests else "VALIDATORS: dict[str, str] = {}\n"
        for block in self.blocks:
            out += "\n" + block + "\n"
        out += "\nINBOUND = {\n" + "".join(f"    {py(t)}: {_const(t)},\n" for t in INBOUND) + "}\n"
        for b in builders:
            out += "\n\n" + b + "\n"
        return out


def _body_digest(fn: Any) -> str:
    """The SHA-256 of what a validator does: its body as `ast.unparse` writes it (no docstring,
    comments, formatting or signature), so that only a change of its logic fails `--check`."""
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(fn))).body
    assert isinstance(node, ast.FunctionDef)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return hashlib.sha256("\n".join(ast.unparse(stmt) for stmt in body).encode()).hexdigest()


def _const(type_: str) -> str:
    return type_.upper()


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's isort order inside one `from` import: CONSTANTS, then Classes, then functions."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[:1].isupper() else (2, name)


def generate() -> str:
    from mind.client import checks
    from protocol import limits, messages

    return Generator(messages, limits, checks.RULES).render()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gen_wire.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the checked-in file is not what the models produce")
    args = ap.parse_args(argv)
    try:
        text = generate()
    except Unsupported as exc:
        print(f"gen_wire: {exc}", file=sys.stderr)
        return 2
    if not args.check:
        OUT.write_text(text)
        print(f"gen_wire: wrote {OUT.relative_to(ROOT)}")
        return 0
    current = OUT.read_text() if OUT.exists() else ""
    if current == text:
        return 0
    diff = difflib.unified_diff(
        current.splitlines(keepends=True), text.splitlines(keepends=True), str(OUT.relative_to(ROOT)), "from the models"
    )
    sys.stderr.writelines(list(diff)[:80])
    print(
        f"\ngen_wire: {OUT.relative_to(ROOT)} is out of step with protocol/messages.py: run scripts/gen_wire.py "
        "(and if a VALIDATORS digest changed, check its twin in mind/client/checks.py RULES first)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
