"""The Containerfile against the repository: every COPY source exists and survives the
ignore file, stages are defined before use, cargo builds packages and binaries that
exist, every workspace member is copied, entrypoints are what the stage copied, and the exposed ports are the ones the
Kubernetes manifests and config use.
"""

import fnmatch
import json
import re
import tomllib

from .report import collect


def _instructions(text):
    """(instruction, argument) pairs with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            word, _, rest = s.partition(" ")
            yield word.upper(), rest.strip()


def _ignored(rel, patterns):
    """Docker ignore semantics for the patterns used here: last match wins, ! re-includes."""
    out = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        hit = (fnmatch.fnmatch(rel, pat) or rel.startswith(pat + "/")
               or (pat.startswith("**/") and (fnmatch.fnmatch(rel, pat[3:]) or f"/{pat[3:]}/" in f"/{rel}/")))
        if hit:
            out = not neg
    return out


def check(deploy):
    repo = deploy.parent
    path = deploy / "container/Containerfile"
    text = path.read_text()
    ignore = [l.strip() for l in (deploy / "container/Containerfile.dockerignore").read_text().splitlines()
              if l.strip() and not l.startswith("#")]
    errors, stages, current = [], {}, None
    packages, copied_srcs = {}, set()
    # cargo resolves the whole workspace: a member left out fails the build.
    members = tomllib.loads((repo / "Cargo.toml").read_text())["workspace"]["members"]
    for m in members:
        doc = tomllib.loads((repo / m / "Cargo.toml").read_text())
        if "package" in doc:
            bins = {b["name"] for b in doc.get("bin", [])}
            packages[doc["package"]["name"]] = bins
    for ins, arg in _instructions(text):
        if ins == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.I)
            base, name = m.group(1), m.group(2)
            if not base.startswith("${") and ":" not in base and base not in stages:
                errors.append(f"FROM {base}: neither an image with a tag nor an earlier stage")
            current = name or base
            stages[current] = {"copied": set(), "ports": set(), "entrypoint": None, "health": None,
                               "parent": stages.get(base)}
        elif ins == "COPY":
            parts = arg.split()
            flags = [p for p in parts if p.startswith("--")]
            srcs, dest = [p for p in parts if not p.startswith("--")][:-1], parts[-1]
            from_stage = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
            if from_stage:
                if from_stage not in stages:
                    errors.append(f"COPY --from={from_stage}: no such earlier stage")
                stages[current]["copied"].add(dest)
                continue
            for s in srcs:
                copied_srcs.add(s.rstrip("/"))
                if not (repo / s).exists():
                    errors.append(f"COPY {s}: not in the repository")
                elif _ignored(s.rstrip("/"), ignore):
                    errors.append(f"COPY {s}: excluded by Containerfile.dockerignore")
        elif ins == "RUN":
            for pkg in re.findall(r"-p\s+(\S+)", arg):
                if pkg not in packages:
                    errors.append(f"cargo -p {pkg}: no such workspace package")
            for pkg, b in re.findall(r"-p\s+(\S+)\s+--bin\s+(\S+)", arg):
                if pkg in packages and b not in packages[pkg]:
                    errors.append(f"cargo -p {pkg} --bin {b}: no such binary in {pkg}")
        elif ins == "EXPOSE":
            stages[current]["ports"] |= set(arg.split())
        elif ins == "ENTRYPOINT":
            stages[current]["entrypoint"] = json.loads(arg)
        elif ins == "HEALTHCHECK":
            cmd = re.search(r"CMD\s+(\[.*\])\s*$", arg)
            if not cmd:
                errors.append("HEALTHCHECK: expected the exec form CMD [...]")
            else:
                stages[current]["health"] = json.loads(cmd.group(1))
    for m in members:
        # `COPY bench bench` also copies the members nested in it (bench/engine, ...).
        parts = m.split("/")
        if not any("/".join(parts[:i]) in copied_srcs for i in range(1, len(parts) + 1)):
            errors.append(f"workspace member {m}/ is not copied into the build stage")
    for name, st in stages.items():
        ep = st["entrypoint"]
        if ep and ep[0] not in st["copied"]:
            errors.append(f"stage {name}: ENTRYPOINT {ep[0]} was not copied into this stage")
    router = stages.get("router")
    if not router:
        errors.append("no `router` stage")
    else:
        if list(stages)[-1] != "router":
            errors.append("the router stage must be last (the default build target)")
        for want in ("8080/tcp", "7946/udp"):
            if want not in router["ports"]:
                errors.append(f"router stage does not EXPOSE {want}")
        if not router["health"] or "/health" not in " ".join(router["health"]):
            errors.append("router stage: HEALTHCHECK must probe /health")
    if "USER" not in {i for i, _ in _instructions(text)}:
        errors.append("no USER: the images must not run as root")
    collect(errors)
    return f"{len(stages)} stages"


def healthcheck_command(deploy, stage="router"):
    """The HEALTHCHECK exec array of a stage (used by the loopback smoke test)."""
    current, out = None, {}
    for ins, arg in _instructions((deploy / "container/Containerfile").read_text()):
        if ins == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", arg, re.I)
            current = m.group(2) or m.group(1)
        elif ins == "HEALTHCHECK":
            out[current] = json.loads(re.search(r"CMD\s+(\[.*\])\s*$", arg).group(1))
    return out.get(stage)
