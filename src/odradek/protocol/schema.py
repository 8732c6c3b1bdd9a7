"""The schema language in which odradek declares every API and internal record, and its parser.

One file per API under `schemas/`, written by us from the seeds' BNF (seed 003, "2 - Protocol") and the
public protocol reference. The generator (`odradek.protocol.generator`) turns each file into flat
per-version encode and decode functions. A file looks like this:

    # Metadata (key 3). Seed 003, "Metadata API".
    api 3 Metadata
    versions 0-12
    flexible 9+

    request
      topics                 []MetadataRequestTopic   null=1+
        topic_id             uuid      10+
        name                 string    null=10+
      allow_auto_topic_creation bool   4+   default=true

    response
      throttle_time_ms       int32     3+
      ...

An internal record (a key or value of `__consumer_offsets` or `__transaction_state`) uses `record <Name>`
instead of `api`, and a single `fields` section.

Field lines: `<name> <type> [versions] [null=<versions>] [tag=<n>] [default=<value>]`, children indented
below a struct-typed field. Versions are `3` (only 3), `3+` (3 and later) or `3-5`; a field without them
exists in every version of its message. Types: int8 int16 int32 int64 uint16 uint32 float64 bool string
bytes uuid records, a struct name (capitalised), and `[]<type>` for arrays. A struct declared at top level
with `struct <Name>` may be used by name in both the request and the response. `tag=<n>` makes the field
tagged (KIP-482) in the flexible versions among its versions. A tagged field holding its default value is
not written (as Apache Kafka does; librdkafka 2.0 mis-skips defaults, see COMPAT-NOTES).
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path

PRIMITIVES = {
    "int8", "int16", "int32", "int64", "uint16", "uint32", "float64", "bool", "string", "bytes",
    "uuid", "records",
}
NULLABLE_TYPES = {"string", "bytes", "records"}
_VERSION_RE = re.compile(r"^(\d+)(\+|-(\d+))?$")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_STRUCT_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")


class SchemaError(ValueError):
    """A schema file that cannot be understood; names the file and line."""


@dataclass(frozen=True)
class Versions:
    low: int
    high: int | None  # None: open-ended

    def contains(self, v: int) -> bool:
        return v >= self.low and (self.high is None or v <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"{self.low}+"
        return str(self.low) if self.low == self.high else f"{self.low}-{self.high}"

    @classmethod
    def parse(cls, text: str) -> "Versions":
        if text == "none":
            return NONE
        m = _VERSION_RE.match(text)
        if not m:
            raise ValueError(f"bad version range {text!r}")
        low = int(m.group(1))
        if m.group(2) == "+":
            return cls(low, None)
        high = int(m.group(3)) if m.group(3) else low
        if high < low:
            raise ValueError(f"bad version range {text!r}")
        return cls(low, high)


NONE = Versions(1 << 30, 1 << 30)
ALL = Versions(0, None)


@dataclass
class Field:
    name: str
    type: str                     # element type for arrays
    is_array: bool
    versions: Versions
    nullable: Versions
    tag: int | None
    default: str | None           # raw text from the schema
    struct: "Struct | None" = None
    line: int = 0

    @property
    def is_struct(self) -> bool:
        return self.struct is not None

    def present(self, v: int) -> bool:
        return self.versions.contains(v)

    def nullable_in(self, v: int) -> bool:
        return self.nullable.contains(v)


@dataclass
class Struct:
    name: str
    fields: list[Field] = field(default_factory=list)


@dataclass
class Message:
    """A request, a response, or an internal record: a top-level struct with a version range."""
    name: str
    struct: Struct
    versions: Versions
    flexible: Versions


@dataclass
class Schema:
    kind: str                     # "api" or "record"
    name: str
    api_key: int | None
    versions: Versions
    flexible: Versions
    messages: list[Message]
    path: str
    header: list[str] = field(default_factory=list)  # the leading comment lines

    @property
    def module_name(self) -> str:
        return snake(self.name)


def snake(name: str) -> str:
    s = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
    return s.lower()


def parse_file(path: str | Path) -> Schema:
    path = Path(path)
    return parse(path.read_text(), str(path.name))


def parse(text: str, where: str = "<schema>") -> Schema:
    lines = text.splitlines()
    header: list[str] = []
    for raw in lines:
        if raw.startswith("#"):
            header.append(raw[1:].strip())
        elif raw.strip():
            break

    def err(lineno: int, msg: str) -> SchemaError:
        return SchemaError(f"{where}:{lineno}: {msg}")

    kind = name = None
    api_key = None
    versions = flexible = None
    sections: list[tuple[str, str | None, list[tuple[int, int, str]]]] = []
    current: list | None = None
    for lineno, raw in enumerate(lines, 1):
        text_line = raw.split("#", 1)[0].rstrip()
        if not text_line.strip():
            continue
        indent = len(text_line) - len(text_line.lstrip(" "))
        if "\t" in raw[:indent + 1]:
            raise err(lineno, "indent with spaces, not tabs")
        words = text_line.split()
        if indent == 0:
            head = words[0]
            if head == "api":
                if len(words) != 3:
                    raise err(lineno, "expected: api <key> <Name>")
                kind, api_key, name = "api", int(words[1]), words[2]
            elif head == "record":
                kind, name = "record", words[1]
            elif head == "versions":
                versions = Versions.parse(words[1])
            elif head == "flexible":
                flexible = Versions.parse(words[1])
            elif head in ("request", "response", "fields"):
                current = []
                sections.append((head, None, current))
            elif head == "struct":
                current = []
                sections.append(("struct", words[1], current))
            else:
                raise err(lineno, f"unknown directive {head!r}")
        else:
            if current is None:
                raise err(lineno, "field outside a section")
            current.append((lineno, indent, text_line.strip()))
    if kind is None or name is None or versions is None or flexible is None:
        raise SchemaError(f"{where}: needs 'api' or 'record', 'versions' and 'flexible' lines")

    common: dict[str, tuple[int, list]] = {}
    for sec, sname, body in sections:
        if sec == "struct":
            common[sname] = (0, body)

    resolved_common: dict[str, Struct] = {}

    def build(body: list, base_indent: int, struct: Struct, seen_structs: dict) -> None:
        i = 0
        while i < len(body):
            lineno, indent, content = body[i]
            if indent != base_indent:
                raise err(lineno, f"unexpected indentation (expected {base_indent} spaces)")
            f = parse_field(content, lineno, err)
            j = i + 1
            while j < len(body) and body[j][1] > base_indent:
                j += 1
            children = body[i + 1:j]
            if f.type not in PRIMITIVES:
                if not _STRUCT_RE.match(f.type):
                    raise err(lineno, f"unknown type {f.type!r}")
                if children:
                    sub = Struct(f.type)
                    build(children, children[0][1], sub, seen_structs)
                    f.struct = sub
                elif f.type in common:
                    f.struct = common_struct(f.type, lineno)
                else:
                    raise err(lineno, f"struct {f.type} has no fields and no 'struct {f.type}' block")
                prior = seen_structs.get(f.type)
                if prior is not None and prior is not f.struct and not same_struct(prior, f.struct):
                    raise err(lineno, f"struct name {f.type} is used twice with different fields")
                seen_structs.setdefault(f.type, f.struct)
            elif children:
                raise err(lineno, f"field {f.name} of type {f.type} cannot have children")
            if any(g.name == f.name for g in struct.fields):
                raise err(lineno, f"duplicate field {f.name}")
            struct.fields.append(f)
            i = j

    def common_struct(sname: str, lineno: int) -> Struct:
        if sname not in resolved_common:
            body = common[sname][1]
            if not body:
                raise err(lineno, f"struct {sname} is empty")
            s = Struct(sname)
            resolved_common[sname] = s
            build(body, body[0][1], s, seen)
        return resolved_common[sname]

    seen: dict[str, Struct] = {}
    messages = []
    for sec, sname, body in sections:
        if sec == "struct":
            continue
        if kind == "api" and sec == "fields" or kind == "record" and sec != "fields":
            raise SchemaError(f"{where}: section {sec!r} does not belong in a {kind} schema")
        suffix = {"request": "Request", "response": "Response", "fields": ""}[sec]
        top = Struct(name + suffix)
        if body:
            build(body, body[0][1], top, seen)
        messages.append(Message(top.name, top, versions, flexible))
    schema = Schema(kind, name, api_key, versions, flexible, messages, where, header)
    validate(schema)
    return schema


def parse_field(content: str, lineno: int, err) -> Field:
    words = content.split()
    if len(words) < 2:
        raise err(lineno, "a field needs a name and a type")
    name, typ = words[0], words[1]
    if not _NAME_RE.match(name) or keyword.iskeyword(name) or name == "unknown_tagged_fields":
        raise err(lineno, f"field name {name!r} must be snake_case and not a Python keyword")
    is_array = typ.startswith("[]")
    if is_array:
        typ = typ[2:]
    versions = ALL
    nullable = NONE
    tag = None
    default = None
    for w in words[2:]:
        try:
            if w.startswith("null="):
                nullable = Versions.parse(w[5:])
            elif w.startswith("tag="):
                tag = int(w[4:])
            elif w.startswith("default="):
                default = w[8:]
            else:
                versions = Versions.parse(w)
        except ValueError as e:
            raise err(lineno, str(e)) from None
    if nullable is not NONE and not is_array and typ not in NULLABLE_TYPES and not _STRUCT_RE.match(typ):
        raise err(lineno, f"type {typ} cannot be nullable")
    return Field(name, typ, is_array, versions, nullable, tag, default, None, lineno)


def same_struct(a: Struct, b: Struct) -> bool:
    if len(a.fields) != len(b.fields):
        return False
    for x, y in zip(a.fields, b.fields):
        if (x.name, x.type, x.is_array, x.versions, x.nullable, x.tag, x.default) != \
           (y.name, y.type, y.is_array, y.versions, y.nullable, y.tag, y.default):
            return False
        if x.struct is not None and not same_struct(x.struct, y.struct):
            return False
    return True


def validate(schema: Schema) -> None:
    top = schema.versions.high
    if top is None:
        raise SchemaError(f"{schema.path}: versions must be a closed range")

    def walk(struct: Struct) -> None:
        tags = set()
        for f in struct.fields:
            if f.versions.low > top:
                raise SchemaError(f"{schema.path}:{f.line}: field {f.name} starts after the last version")
            if f.tag is not None:
                if f.tag in tags:
                    raise SchemaError(f"{schema.path}:{f.line}: tag {f.tag} used twice in {struct.name}")
                tags.add(f.tag)
                if schema.flexible is NONE or f.versions.low < schema.flexible.low:
                    raise SchemaError(f"{schema.path}:{f.line}: tagged field {f.name} in a non-flexible version")
            if f.struct is not None:
                walk(f.struct)

    for m in schema.messages:
        walk(m.struct)


def load_all(directory: str | Path) -> list[Schema]:
    out = [parse_file(p) for p in sorted(Path(directory).glob("*.schema"))]
    keys: dict[int, str] = {}
    names: dict[str, str] = {}
    for s in out:
        if s.api_key is not None:
            if s.api_key in keys:
                raise SchemaError(f"api key {s.api_key} declared by {keys[s.api_key]} and {s.path}")
            keys[s.api_key] = s.path
        if s.module_name in names:
            raise SchemaError(f"name {s.name} declared by {names[s.module_name]} and {s.path}")
        names[s.module_name] = s.path
    return out
