"""Router TOML files under deploy/ against the Rust config schema.

The router rejects unknown keys at start-up (`deny_unknown_fields`), so a typo in a
ConfigMap would crash-loop every pod. This reads the config structs and their `Default`
impls from the Rust sources and checks (1) every key of every TOML file names a field of
the right struct and (2) every commented `# key = value` line states the code's
current default (examples are written `# e.g. ...` and not checked).
"""

import re
import tomllib

from .report import CheckError, collect

SOURCES = [
    "router/src/config/mod.rs", "router/src/config/mesh.rs", "router/src/config/edge.rs",
    "core/src/policy/slo.rs", "core/src/policy/baselines.rs",
    "core/src/policy/peers/llmd_predicted.rs", "core/src/region.rs", "core/src/pd/mod.rs", "predictor/src/config.rs",
]
ROOT = "RouterConfig"
_STRUCT = re.compile(r"pub struct (\w+)\s*\{(.*?)\n\}", re.S)
_FIELD = re.compile(r"^\s*pub (\w+):\s*([^\n]+?),\s*$", re.M)
_DEFAULT = re.compile(r"impl Default for (\w+)\s*\{\s*fn default\(\) -> Self\s*\{\s*Self\s*\{(.*?)\n\s*\}\s*\n\s*\}", re.S)
_DEFAULT_FN = re.compile(r"fn (default_\w+)\(\) -> \w+\s*\{\s*([^}]+?)\s*\}")
_SERDE_DEFAULT = re.compile(r'#\[serde\(default = "(\w+)"\)\]\s*pub (\w+):')


def schema(repo):
    """{struct: {field: type}} and {struct: {field: default literal}} from the sources."""
    structs, defaults = {}, {}
    for rel in SOURCES:
        text = (repo / rel).read_text()
        for m in _STRUCT.finditer(text):
            structs[m.group(1)] = dict(_FIELD.findall(m.group(2)))
        for m in _DEFAULT.finditer(text):
            defaults[m.group(1)] = {k: v.strip() for k, v in re.findall(r"^\s*(\w+):\s*([^\n]+?),\s*$", m.group(2), re.M)}
        fns = dict(_DEFAULT_FN.findall(text))
        for m in _STRUCT.finditer(text):
            for fn, field in _SERDE_DEFAULT.findall(m.group(2)):
                if fn in fns:
                    defaults.setdefault(m.group(1), {})[field] = fns[fn].strip()
    if ROOT not in structs:
        raise CheckError("RouterConfig not found in router/src/config/mod.rs")
    return structs, defaults


def _inner(ty):
    """The struct a field's type refers to, and whether it is an array of tables."""
    # Paths (`crate::edge::EdgeConfig`) name the struct by their last segment.
    ty = re.sub(r"\w+::", "", ty.replace(" ", ""))
    m = re.fullmatch(r"(?:Option<)?(Vec<)?(\w+)>?>?", ty)
    if not m:
        return None, False
    return m.group(2), bool(m.group(1))


def check_keys(table, struct, structs, where, errors):
    fields = structs.get(struct)
    if fields is None:
        return
    for key, value in table.items():
        if key not in fields:
            errors.append(f"{where}: unknown key `{key}` (no field in {struct})")
            continue
        inner, is_vec = _inner(fields[key])
        if inner in structs:
            items = value if is_vec and isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if isinstance(item, dict):
                    check_keys(item, inner, structs, f"{where}.{key}" + (f"[{i}]" if is_vec else ""), errors)


def rust_literal(text):
    """Python value of a simple Rust default expression, or None if not a literal."""
    t = text.strip()
    t = re.sub(r"\.(into|to_string|to_owned)\(\)$", "", t)
    if t in ("true", "false"):
        return t == "true"
    if re.fullmatch(r'"[^"]*"', t):
        return t[1:-1]
    if t in ("Vec::new()", "vec![]"):
        return []
    if re.fullmatch(r"[0-9_]+\.[0-9_]*", t):
        return float(t.replace("_", ""))
    if re.fullmatch(r"[0-9_]+(\s*<<\s*[0-9]+)?", t):
        parts = [int(p.replace("_", "")) for p in t.split("<<")]
        return parts[0] << parts[1] if len(parts) == 2 else parts[0]
    return None


_COMMENTED = re.compile(r"^#\s?(\[\[?[a-z_.]+\]\]?|[a-z_]+\s*=\s*.+?)\s*(?:#.*)?$")


def commented_defaults(text):
    """[(table path, key, value, line number)] of `# key = value` lines."""
    out, table = [], ()
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        head = re.match(r"^#?\s?\[\[?([a-z_.]+)\]\]?", s)
        if head and (not s.startswith("#") or _COMMENTED.match(s)):
            table = tuple(head.group(1).split("."))
            continue
        m = _COMMENTED.match(s)
        if s.startswith("#") and m and "=" in m.group(1) and not s.startswith("# e.g."):
            key, _, raw = m.group(1).partition("=")
            try:
                value = tomllib.loads(f"v = {raw.strip()}")["v"]
            except tomllib.TOMLDecodeError:
                continue  # prose that happens to contain '='
            out.append((table, key.strip(), value, n))
    return out


def struct_at(path, structs):
    struct = ROOT
    for part in path:
        inner, _ = _inner(structs.get(struct, {}).get(part, ""))
        if inner not in structs:
            return None
        struct = inner
    return struct


def check_file(path, repo):
    structs, defaults = schema(repo)
    text = path.read_text()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CheckError(f"{path}: {e}")
    errors = []
    check_keys(doc, ROOT, structs, path.name, errors)
    checked = 0
    for table, key, value, line in commented_defaults(text):
        struct = struct_at(table, structs)
        where = f"{path.name}:{line}"
        if struct is None:
            errors.append(f"{where}: commented table [{'.'.join(table)}] is not in the schema")
            continue
        if key not in structs[struct]:
            errors.append(f"{where}: commented key `{key}` is not a field of {struct}")
            continue
        code = defaults.get(struct, {}).get(key)
        want = rust_literal(code) if code is not None else None
        if want is None:
            errors.append(f"{where}: `{key}` has no literal default in {struct} (write it as `# e.g.`)")
        elif want != value and not (isinstance(want, (int, float)) and isinstance(value, (int, float)) and float(want) == float(value)):
            errors.append(f"{where}: `{key} = {value!r}` but the code's default is {code}")
        else:
            checked += 1
    collect(errors)
    return f"{checked} documented defaults match"
