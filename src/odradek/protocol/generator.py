"""Turn the schemas under `schemas/` into flat, per-version encode and decode functions.

    python -m odradek.protocol.generator           # rewrite odradek/protocol/messages/
    python -m odradek.protocol.generator --check   # exit 1 if the committed code has drifted

Each schema becomes one module in `messages/`: a class per struct (one class for every version of a
message, as Kafka's generated Java does), and for each version a decoder `(data, pos) -> (obj, pos)`
and an encoder `(writer, obj) -> None` with every branch on version resolved at generation time.
Versions whose code is identical share one function. The generated code calls only the primitives of
`odradek.protocol.codec`; every length it reads is checked there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from odradek.protocol.schema import Field, Message, Schema, Struct, load_all

HERE = Path(__file__).parent
SCHEMA_DIR = HERE / "schemas"
OUT_DIR = HERE / "messages"

_FIXED = {
    # type: (unpack name, pack name, size, struct format char)
    "int8": ("u_i8", "p_i8", 1, "b"),
    "int16": ("u_i16", "p_i16", 2, "h"),
    "int32": ("u_i32", "p_i32", 4, "i"),
    "int64": ("u_i64", "p_i64", 8, "q"),
    "uint16": ("u_u16", "p_u16", 2, "H"),
    "uint32": ("u_u32", "p_u32", 4, "I"),
    "float64": ("u_f64", "p_f64", 8, "d"),
}


def default_expr(f: Field) -> str:
    d = f.default
    if f.is_array:
        return "None" if d == "null" else "[]"
    if f.struct is not None:
        return "None" if d == "null" else f"{f.struct.name}()"
    t = f.type
    if t in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        return str(int(d, 0)) if d else "0"
    if t == "float64":
        return repr(float(d)) if d else "0.0"
    if t == "bool":
        return "True" if d == "true" else "False"
    if t == "string":
        if d == "null":
            return "None"
        return repr(d.strip('"')) if d else "''"
    if t == "bytes":
        return "None" if d == "null" else "b''"
    if t == "records":
        return "None"
    if t == "uuid":
        return "ZERO_UUID"
    raise AssertionError(t)


def _is_mutable_default(f: Field) -> bool:
    return (f.is_array or f.struct is not None) and f.default != "null"


class ModuleWriter:
    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.classes: dict[str, Struct] = {}
        self.funcs: list[str] = []
        self.canonical: dict[tuple[str, str, int], str] = {}   # (kind, struct, version) -> function
        self.bodies: dict[tuple[str, str, str], str] = {}      # (kind, struct, body) -> function
        self.struct_defaults: set[str] = set()                 # structs compared to a default

    # --------------------------------------------------------------------------------- classes
    def collect(self, s: Struct) -> None:
        for f in s.fields:
            if f.struct is not None:
                self.collect(f.struct)
        self.classes.setdefault(s.name, s)

    def emit_class(self, s: Struct) -> str:
        names = [f.name for f in s.fields]
        out = [f"class {s.name}(Message):"]
        out.append(f"    __slots__ = {tuple(names + ['unknown_tagged_fields'])!r}")
        out.append(f"    FIELDS = {tuple(names)!r}")
        out.append("")
        params = []
        body = []
        for f in s.fields:
            if _is_mutable_default(f):
                params.append(f"{f.name}=_UNSET")
                body.append(f"        self.{f.name} = {default_expr(f)} if {f.name} is _UNSET else {f.name}")
            else:
                params.append(f"{f.name}={default_expr(f)}")
                body.append(f"        self.{f.name} = {f.name}")
        params.append("unknown_tagged_fields=None")
        body.append("        self.unknown_tagged_fields = unknown_tagged_fields")
        out.append(f"    def __init__(self, *, {', '.join(params)}):")
        out.extend(body)
        return "\n".join(out)

    # --------------------------------------------------------------------------------- decoding
    def read_value(self, f: Field, v: int, flex: bool, target: str, ind: str, depth: int,
                   elem: bool = False) -> list[str]:
        """Lines that read one value of f (an element if elem) into `target`."""
        nullable = f.nullable_in(v)
        if f.is_array and not elem:
            n, lst = f"n{depth}", f"lst{depth}"
            lines = [f"{ind}{n}, pos = {'r_ccount' if flex else 'r_count'}(data, pos)"]
            if f.type in _FIXED:
                un, _, size, ch = _FIXED[f.type]
                lines.append(f"{ind}if {n} >= 0:")
                lines.append(f"{ind}    {target} = list(_unpack_from('>%d{ch}' % {n}, data, pos))")
                lines.append(f"{ind}    pos += {size} * {n}")
            else:
                lines.append(f"{ind}if {n} >= 0:")
                lines.append(f"{ind}    {lst} = []")
                lines.append(f"{ind}    for _ in range({n}):")
                lines.extend(self.read_value(f, v, flex, f"x{depth}", ind + "        ", depth + 1, True))
                lines.append(f"{ind}        {lst}.append(x{depth})")
                lines.append(f"{ind}    {target} = {lst}")
            lines.append(f"{ind}elif {n} == -1:")
            if nullable:
                lines.append(f"{ind}    {target} = None")
            else:
                lines.append(f"{ind}    fail('non-nullable array {f.name} is null')")
            return lines
        t = f.type
        if f.struct is not None:
            fn = self.func("d", f.struct, v)
            if nullable and not elem:
                return [f"{ind}if data[pos] == 0xFF:",
                        f"{ind}    {target} = None",
                        f"{ind}    pos += 1",
                        f"{ind}else:",
                        f"{ind}    {target}, pos = {fn}(data, pos + 1)"]
            return [f"{ind}{target}, pos = {fn}(data, pos)"]
        if t in _FIXED:
            un, _, size, _ = _FIXED[t]
            return [f"{ind}{target}, = {un}(data, pos)", f"{ind}pos += {size}"]
        if t == "bool":
            return [f"{ind}{target} = data[pos] != 0", f"{ind}pos += 1"]
        if t == "uuid":
            return [f"{ind}{target}, pos = r_uuid(data, pos)"]
        if t in ("string", "bytes"):
            reader = "r_" + ("c" if flex else "") + ("n" if nullable else "") + t
            return [f"{ind}{target}, pos = {reader}(data, pos)"]
        if t == "records":
            return [f"{ind}{target}, pos = {'r_crecords' if flex else 'r_records'}(data, pos)"]
        raise AssertionError(t)

    def decoder_body(self, s: Struct, v: int, flex: bool) -> list[str]:
        lines = [f"    o = _new({s.name})"]
        tagged = []
        for f in s.fields:
            if not f.present(v):
                lines.append(f"    o.{f.name} = {default_expr(f)}")
            elif f.tag is not None and flex:
                tagged.append(f)
                lines.append(f"    o.{f.name} = {default_expr(f)}")
            elif f.tag is None:
                lines.extend(self.read_value(f, v, flex, f"o.{f.name}", "    ", 0))
        if flex:
            lines.append("    nt, pos = r_tag_header(data, pos)")
            lines.append("    if nt:")
            lines.append("        last = -1")
            lines.append("        unknown = []")
            lines.append("        for _ in range(nt):")
            lines.append("            tag, size, pos = r_tag(data, pos, last)")
            lines.append("            last = tag")
            lines.append("            end = pos + size")
            kw = "if"
            for f in sorted(tagged, key=lambda f: f.tag):
                lines.append(f"            {kw} tag == {f.tag}:")
                lines.extend(self.read_value(f, v, flex, f"o.{f.name}", "                ", 0))
                lines.append(f"                check_tag_end(tag, pos, end)")
                kw = "elif"
            if tagged:
                lines.append("            else:")
                lines.append("                unknown.append((tag, bytes(data[pos:end])))")
                lines.append("                pos = end")
            else:
                lines.append("            unknown.append((tag, bytes(data[pos:end])))")
                lines.append("            pos = end")
            lines.append("        o.unknown_tagged_fields = unknown or None")
            lines.append("    else:")
            lines.append("        o.unknown_tagged_fields = None")
        else:
            lines.append("    o.unknown_tagged_fields = None")
        lines.append("    return o, pos")
        return lines

    # --------------------------------------------------------------------------------- encoding
    def write_value(self, f: Field, v: int, flex: bool, src: str, ind: str, depth: int,
                    elem: bool = False, w: str = "w") -> list[str]:
        nullable = f.nullable_in(v)
        if f.is_array and not elem:
            lst = f"lst{depth}"
            lines = [f"{ind}{lst} = {src}", f"{ind}if {lst} is None:"]
            if nullable:
                lines.append(f"{ind}    {w}.append(0)" if flex else f"{ind}    {w} += b'\\xff\\xff\\xff\\xff'")
            else:
                lines.append(f"{ind}    raise ValueError('non-nullable array {f.name} is None')")
            lines.append(f"{ind}else:")
            if flex:
                lines.append(f"{ind}    w_uvarint({w}, len({lst}) + 1)")
            else:
                lines.append(f"{ind}    {w} += p_i32(len({lst}))")
            if f.type in _FIXED:
                ch = _FIXED[f.type][3]
                lines.append(f"{ind}    {w} += _pack('>%d{ch}' % len({lst}), *{lst})")
            else:
                lines.append(f"{ind}    for x{depth} in {lst}:")
                lines.extend(self.write_value(f, v, flex, f"x{depth}", ind + "        ", depth + 1, True, w))
            return lines
        t = f.type
        if f.struct is not None:
            fn = self.func("e", f.struct, v)
            if nullable and not elem:
                return [f"{ind}if {src} is None:",
                        f"{ind}    {w} += b'\\xff'",
                        f"{ind}else:",
                        f"{ind}    {w}.append(1)",
                        f"{ind}    {fn}({w}, {src})"]
            return [f"{ind}{fn}({w}, {src})"]
        if t in _FIXED:
            return [f"{ind}{w} += {_FIXED[t][1]}({src})"]
        if t == "bool":
            return [f"{ind}{w}.append(1 if {src} else 0)"]
        if t == "uuid":
            return [f"{ind}{w} += {src}.bytes"]
        if t in ("string", "bytes"):
            fn = "w_" + ("c" if flex else "") + ("n" if nullable else "") + t
            return [f"{ind}{fn}({w}, {src})"]
        if t == "records":
            return [f"{ind}{'w_crecords' if flex else 'w_records'}({w}, {src})"]
        raise AssertionError(t)

    def encoder_body(self, s: Struct, v: int, flex: bool) -> list[str]:
        lines = []
        tagged = []
        for f in s.fields:
            if not f.present(v):
                continue
            if f.tag is not None:
                if flex:
                    tagged.append(f)
                continue
            lines.extend(self.write_value(f, v, flex, f"o.{f.name}", "    ", 0))
        if flex:
            if not tagged:
                lines.append("    if o.unknown_tagged_fields:")
                lines.append("        w_tagged(w, sorted(o.unknown_tagged_fields))")
                lines.append("    else:")
                lines.append("        w.append(0)")
            else:
                # A tagged field holding its default is not written; struct defaults are compared
                # against one module-level instance rather than a fresh one per message.
                lines.append("    tags = list(o.unknown_tagged_fields) if o.unknown_tagged_fields else None")
                for f in sorted(tagged, key=lambda f: f.tag):
                    if f.is_array and f.default != "null":
                        cond = f"o.{f.name}"
                    elif f.struct is not None and f.default != "null":
                        cond = self.differs_from_default(f)
                    else:
                        cond = f"o.{f.name} != {default_expr(f)}"
                    lines.append(f"    if {cond}:")
                    lines.append("        t = bytearray()")
                    lines.extend(self.write_value(f, v, flex, f"o.{f.name}", "        ", 0, w="t"))
                    lines.append("        if tags is None:")
                    lines.append("            tags = []")
                    lines.append(f"        tags.append(({f.tag}, t))")
                lines.append("    if tags:")
                lines.append("        tags.sort(key=_first)")
                lines.append("        w_tagged(w, tags)")
                lines.append("    else:")
                lines.append("        w.append(0)")
        if not lines:
            lines.append("    pass")
        return lines

    def differs_from_default(self, f: Field) -> str:
        """An expression true when struct field f differs from its default value: field by field
        for structs of scalars (the common case: epochs and offsets), else by equality with one
        module-level default instance."""
        fields = f.struct.fields
        if all(g.struct is None and not g.is_array for g in fields):
            parts = [f"x.{g.name} != {default_expr(g)}" for g in fields] + ["x.unknown_tagged_fields"]
            return f"(x := o.{f.name}) is not None and ({' or '.join(parts)})"
        self.struct_defaults.add(f.struct.name)
        return f"o.{f.name} != _DEFAULT_{f.struct.name}"

    # --------------------------------------------------------------------------------- functions
    def func(self, kind: str, s: Struct, v: int) -> str:
        key = (kind, s.name, v)
        name = self.canonical.get(key)
        if name is not None:
            return name
        flex = self.schema.flexible.contains(v)
        body = self.decoder_body(s, v, flex) if kind == "d" else self.encoder_body(s, v, flex)
        text = "\n".join(body)
        prior = self.bodies.get((kind, s.name, text))
        if prior is not None:
            self.canonical[key] = prior
            return prior
        name = f"_{kind}_{s.name}_{v}"
        sig = "(data, pos)" if kind == "d" else "(w, o)"
        self.funcs.append(f"def {name}{sig}:\n{text}")
        self.bodies[(kind, s.name, text)] = name
        self.canonical[key] = name
        return name

    def render(self) -> str:
        sc = self.schema
        for m in sc.messages:
            self.collect(m.struct)
        low, high = sc.versions.low, sc.versions.high
        tables = []
        for m in sc.messages:
            role = {"Request": "REQUEST", "Response": "RESPONSE"}.get(m.name[len(sc.name):], "RECORD")
            dec = [self.func("d", m.struct, v) for v in range(low, high + 1)]
            enc = [self.func("e", m.struct, v) for v in range(low, high + 1)]
            pad = ["None"] * low
            tables.append(f"{role}_CLASS = {m.struct.name}")
            tables.append(f"{role}_DECODERS = ({', '.join(pad + dec)},)")
            tables.append(f"{role}_ENCODERS = ({', '.join(pad + enc)},)")
        for cls in self.classes.values():
            for f in cls.fields:
                if f.struct is not None:
                    tables.append(f"{cls.name}.{f.struct.name} = {f.struct.name}")
        flexible = "None" if sc.flexible.high is not None and sc.flexible.low > high else str(sc.flexible.low)
        head = [
            f"# GENERATED by odradek.protocol.generator from schemas/{Path(sc.path).name}; do not edit.",
            *(f"# {line}" if line else "#" for line in sc.header),
            "# fmt: off",
            "# ruff: noqa",
            "from struct import pack as _pack, unpack_from as _unpack_from",
            "",
            "from odradek.protocol.codec import (",
            "    ZERO_UUID, Message, check_tag_end, fail, p_f64, p_i8, p_i16, p_i32, p_i64, p_u16, p_u32,",
            "    r_bytes, r_cbytes, r_ccount, r_cnbytes, r_cnstring, r_count, r_crecords, r_cstring,",
            "    r_nbytes, r_nstring, r_records, r_string, r_tag, r_tag_header, r_uuid, u_f64, u_i8,",
            "    u_i16, u_i32, u_i64, u_u16, u_u32, w_bytes, w_cbytes, w_cnbytes, w_cnstring, w_crecords,",
            "    w_cstring, w_nbytes, w_nstring, w_records, w_string, w_tagged, w_uvarint,",
            ")",
            "",
            "_new = object.__new__",
            "_UNSET = object()",
            "",
            "",
            "def _first(pair):",
            "    return pair[0]",
            "",
            "",
            f"NAME = {sc.name!r}",
            f"API_KEY = {sc.api_key!r}",
            f"MIN_VERSION = {low}",
            f"MAX_VERSION = {high}",
            f"FLEXIBLE_MIN_VERSION = {flexible}",
        ]
        parts = ["\n".join(head)]
        parts.extend(self.emit_class(c) for c in self.classes.values())
        if self.struct_defaults:
            parts.append("\n".join(f"_DEFAULT_{n} = {n}()" for n in sorted(self.struct_defaults)))
        parts.extend(self.funcs)
        parts.append("\n".join(tables))
        return "\n\n\n".join(parts) + "\n"


REGISTRY_CODE = '''
class _Registry(dict):
    """The declared modules by key, each imported on its first lookup and then kept, so every later
    `registry[key]` is a plain dict lookup (the hot path pays nothing for the laziness). Membership,
    `get`, `len` and iteration see every declared key; `keys`, `values` and `items` import them all."""

    def __init__(self, names):
        super().__init__()
        self._names = names

    def __missing__(self, key):
        module = self[key] = _import_module(f"{__name__}.{self._names[key]}")
        return module

    def get(self, key, default=None):
        return self[key] if key in self._names else default

    def __contains__(self, key):
        return key in self._names

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def _load_all(self):
        for key in self._names:
            self[key]

    def keys(self):
        self._load_all()
        return super().keys()

    def values(self):
        self._load_all()
        return super().values()

    def items(self):
        self._load_all()
        return super().items()


APIS = _Registry(API_MODULES)
RECORDS = _Registry(RECORD_MODULES)
_MODULES = frozenset(API_MODULES.values()) | frozenset(RECORD_MODULES.values())


def __getattr__(name):
    """`messages.<module>` imports that module on first use (PEP 562)."""
    if name in _MODULES:
        return _import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _MODULES)
'''


def render_registry(schemas: list[Schema]) -> str:
    """The package's `__init__`: tables of module names, not imports. Importing all 84 modules cost
    each CLI command about 0.6 s (issue 34); now a module is imported when a caller first asks for it,
    and `API_VERSION_RANGES` answers a client's ApiVersions negotiation without importing any."""
    apis = sorted((s for s in schemas if s.kind == "api"), key=lambda s: s.api_key)
    records = sorted((s for s in schemas if s.kind == "record"), key=lambda s: s.name)
    lines = [
        "# GENERATED by odradek.protocol.generator; do not edit.",
        '"""Every API (by key) and internal record (by name) odradek declares.',
        "",
        "`APIS` and `RECORDS` map each to its generated module, imported on first lookup; `messages.<name>`",
        "imports a module on first use (PEP 562). Nothing is imported with the package, so a command that",
        "speaks three APIs loads three modules.",
        '"""',
        "# fmt: off",
        "from importlib import import_module as _import_module",
        "",
        "API_MODULES = {",
    ]
    lines += [f"    {s.api_key}: {s.module_name!r}," for s in apis]
    lines += ["}", "", "RECORD_MODULES = {"]
    lines += [f"    {s.name!r}: {s.module_name!r}," for s in records]
    lines += ["}", "", "# Each API's name (its module's NAME), for tools that list APIs without using them.",
              "API_NAMES = {"]
    lines += [f"    {s.api_key}: {s.name!r}," for s in apis]
    lines += ["}", "", "# (MIN_VERSION, MAX_VERSION) of each API, as its module declares them.",
              "API_VERSION_RANGES = {"]
    lines += [f"    {s.api_key}: ({s.versions.low}, {s.versions.high})," for s in apis]
    lines += ["}", ""]
    return "\n".join(lines) + REGISTRY_CODE


def generate(schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """The generated files, as {file name: text}."""
    schemas = load_all(schema_dir)
    out = {f"{s.module_name}.py": ModuleWriter(s).render() for s in schemas}
    out["__init__.py"] = render_registry(schemas)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the generated code is out of date")
    args = ap.parse_args(argv)
    files = generate()
    existing = {p.name for p in OUT_DIR.glob("*.py")}
    if args.check:
        stale = [n for n, text in files.items()
                 if not (OUT_DIR / n).exists() or (OUT_DIR / n).read_text() != text]
        extra = sorted(existing - set(files))
        if stale or extra:
            print(f"generated code drifted from the schemas: stale {stale}, extra {extra}", file=sys.stderr)
            print("run: python -m odradek.protocol.generator", file=sys.stderr)
            return 1
        print(f"generated code matches {len(files) - 1} schemas")
        return 0
    OUT_DIR.mkdir(exist_ok=True)
    for name in existing - set(files):
        (OUT_DIR / name).unlink()
    for name, text in files.items():
        path = OUT_DIR / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    print(f"wrote {len(files) - 1} message modules to {OUT_DIR.name}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
