"""Kubernetes manifests: every YAML parses, every kustomization builds, and the built
objects hang together the way the router needs.

Builds use `kubectl kustomize` (kustomize is compiled into kubectl) on a temporary copy
of deploy/kubernetes, so combinations of overlays and components can be composed with
relative paths. Schema validation (kubernetes-validate, strict) covers built-in kinds;
CRD kinds get structural checks only.
"""

import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import yaml

from . import configs
from .report import CheckError, Skip, collect, require

# Builds to check: name -> (resources, components), relative to deploy/kubernetes.
BUILDS = {
    "base": (["base"], []),
    "overlays/demo": (["overlays/demo"], []),
    "overlays/vllm": (["overlays/vllm"], []),
    "vllm + cert-manager-csi + prometheus-operator": (
        ["overlays/vllm"], ["components/cert-manager-csi", "components/prometheus-operator"]),
}
ROUTER = {"app.kubernetes.io/name": "headroom", "app.kubernetes.io/component": "router"}
CRD_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")
# Secrets the operator creates by hand (deploy/README.md) and ones cert-manager writes.
EXTERNAL_SECRETS = {"headroom-mesh-ca", "hf-token", "headroom-mesh-ca-cm"}


def yaml_files(deploy):
    errors, n = [], 0
    for p in sorted(deploy.rglob("*.y*ml")):
        try:
            list(yaml.safe_load_all(p.read_text()))
            n += 1
        except yaml.YAMLError as e:
            errors.append(f"{p.relative_to(deploy)}: {e}")
    collect(errors)
    return f"{n} files"


def build(deploy, name):
    if not shutil.which("kubectl"):
        raise Skip("kubectl (with its built-in kustomize) is not installed")
    resources, components = BUILDS[name]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "k"
        shutil.copytree(deploy / "kubernetes", root)
        top = root / "_check"
        top.mkdir()
        # As a user's overlay would: components listed next to a namespace.
        kz = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "headroom",
              "resources": [f"../{r}" for r in resources], "components": [f"../{c}" for c in components]}
        (top / "kustomization.yaml").write_text(yaml.safe_dump(kz))
        out = subprocess.run(["kubectl", "kustomize", str(top)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise CheckError(f"kubectl kustomize failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def schema_validate(objs, k8s_version):
    try:
        import kubernetes_validate
    except ImportError:
        raise Skip("kubernetes-validate is not installed (see deploy/check.sh)")
    errors, n = [], 0
    for o in objs:
        if o.get("apiVersion", "").startswith(CRD_GROUPS):
            continue
        try:
            kubernetes_validate.validate(o, k8s_version, strict=True)
            n += 1
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{o['kind']}/{o['metadata']['name']}: {e.message} at {'.'.join(map(str, e.path))}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{o['kind']}/{o['metadata']['name']}: no schema ({e})")
    collect(errors)
    return f"{n} objects against Kubernetes {k8s_version}"


def _matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _pod_templates(objs):
    for o in objs:
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            yield o, o["spec"]["template"]


def _expand(s, env):
    """Kubernetes' $(VAR) expansion; unknown names are reported, not left silently."""
    missing = [v for v in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", s) if v not in env]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), s), missing


def _flag(args, name):
    for a in args:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return None


def structure(objs, repo):
    errors = []
    by_kind = {}
    for o in objs:
        require("metadata" in o and o["metadata"].get("name"), f"object without a name: {o.get('kind')}")
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
        if o["kind"] != "Namespace" and o["metadata"].get("namespace") != "headroom":
            errors.append(f"{o['kind']}/{o['metadata']['name']}: not in namespace headroom")
    cms = by_kind.get("ConfigMap", {})
    services = by_kind.get("Service", {})
    templates = list(_pod_templates(objs))

    for w, t in templates:
        wname = f"{w['kind']}/{w['metadata']['name']}"
        labels = t["metadata"].get("labels", {})
        if not _matches(w["spec"]["selector"].get("matchLabels", {}), labels):
            errors.append(f"{wname}: selector does not match its pod template")
        spec = t["spec"]
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for v in vols.values():
            if "configMap" in v and v["configMap"]["name"] not in cms:
                errors.append(f"{wname}: volume {v['name']} names missing ConfigMap {v['configMap']['name']}")
            if "secret" in v and v["secret"]["secretName"] not in EXTERNAL_SECRETS | set(by_kind.get("Secret", {})):
                errors.append(f"{wname}: volume {v['name']} names unknown Secret {v['secret']['secretName']}")
        for c in spec.get("initContainers", []) + spec.get("containers", []):
            cname = f"{wname} container {c['name']}"
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    errors.append(f"{cname}: mounts undefined volume {m['name']}")
            env = {e["name"]: "<" + e["name"] + ">" for e in c.get("env", [])}
            for s in c.get("command", []) + c.get("args", []):
                _, missing = _expand(s, env)
                errors += [f"{cname}: $({v}) is not in its env (Kubernetes would pass it literally)" for v in missing]
            ports = {p.get("name") for p in c.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    errors.append(f"{cname}: {probe} uses unknown port {port}")

    for s in services.values():
        sel = s["spec"].get("selector", {})
        pods = [t for _, t in templates if _matches(sel, t["metadata"].get("labels", {}))]
        if not pods:
            errors.append(f"Service/{s['metadata']['name']}: selects no pod template in this build")
            continue
        for sp in s["spec"]["ports"]:
            tp, proto = sp.get("targetPort", sp["port"]), sp.get("protocol", "TCP")
            found = any(
                (p.get("name") == tp or p["containerPort"] == tp) and p.get("protocol", "TCP") == proto
                for t in pods for c in t["spec"]["containers"] for p in c.get("ports", []))
            if not found:
                errors.append(f"Service/{s['metadata']['name']}: targetPort {tp}/{proto} is no container port")

    router = [(w, t) for w, t in templates if _matches(ROUTER, t["metadata"].get("labels", {}))]
    require(len(router) == 1, f"expected one router workload, found {len(router)}")
    errors += _router_checks(router[0], by_kind, repo)
    collect(errors)
    return f"{len(objs)} objects"


def _router_checks(wt, by_kind, repo):
    errors = []
    w, t = wt
    spec = t["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "headroom")
    args = c.get("args", [])
    env = {e["name"]: e for e in c.get("env", [])}
    field = lambda n: env.get(n, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if _flag(args, "node-id") != "$(POD_NAME)" or field("POD_NAME") != "metadata.name":
        errors.append("router: --node-id must be the pod name (downward API metadata.name)")
    if field("POD_IP") != "status.podIP":
        errors.append("router: POD_IP must come from status.podIP")
    if (c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/ready"
            or c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health"):
        errors.append("router: readiness must probe /ready and liveness /health")

    # The config the container reads, as rendered into the ConfigMap.
    cfg_path = _flag(args, "config")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    cfg = None
    for mp, m in mounts.items():
        if cfg_path and cfg_path.startswith(mp.rstrip("/") + "/") and "configMap" in vols.get(m["name"], {}):
            cm = by_kind["ConfigMap"][vols[m["name"]]["configMap"]["name"]]
            key = cfg_path[len(mp.rstrip("/")) + 1:]
            if key not in cm.get("data", {}):
                errors.append(f"router: --config {cfg_path} but ConfigMap has no key {key}")
            else:
                cfg = cm["data"][key]
    if cfg is None:
        return errors + [f"router: --config {cfg_path} is not a mounted ConfigMap key"]
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(cfg)
    try:
        configs.check_file(Path(f.name), repo)
    except CheckError as e:
        errors.append(f"rendered config: {e}")
    finally:
        Path(f.name).unlink()
    doc = tomllib.loads(cfg)
    mesh = doc.get("mesh", {})
    gossip_port = int(mesh.get("listen", ":0").rsplit(":", 1)[1])
    http_port = int(doc.get("listen", ":8080").rsplit(":", 1)[1])
    cports = {p["name"]: p for p in c.get("ports", [])}
    if cports.get("http", {}).get("containerPort") != http_port:
        errors.append(f"router: container port http != config listen port {http_port}")
    if cports.get("gossip", {}).get("containerPort") != gossip_port or cports["gossip"].get("protocol") != "UDP":
        errors.append(f"router: container port gossip must be UDP {gossip_port} (mesh.listen)")
    tls_dir = mesh.get("tls_dir") or _flag(args, "gossip-tls-dir")
    if not tls_dir or tls_dir not in mounts:
        errors.append(f"router: mesh tls_dir {tls_dir} is not a mounted volume")
    else:
        vol = mounts[tls_dir]["name"]
        writers = [ic for ic in spec.get("initContainers", [])
                   if any(m["name"] == vol and not m.get("readOnly") for m in ic.get("volumeMounts", []))]
        if not writers:
            errors.append(f"router: nothing writes the mesh certificates into volume {vol}")
    adv = _flag(args, "gossip-advertise") or ""
    if not adv.endswith(f":{gossip_port}"):
        errors.append(f"router: --gossip-advertise {adv} must use the gossip port {gossip_port}")

    # Peer discovery through the headless Service.
    peer = _flag(args, "peer") or ""
    m = re.fullmatch(r"([a-z0-9-]+)\.\$\(POD_NAMESPACE\)\.svc\.cluster\.local:(\d+)", peer)
    if not m:
        errors.append(f"router: --peer {peer} is not <service>.$(POD_NAMESPACE).svc.cluster.local:<port>")
    else:
        svc = by_kind.get("Service", {}).get(m.group(1))
        if not svc:
            errors.append(f"router: --peer names missing Service {m.group(1)}")
        else:
            ss = svc["spec"]
            if ss.get("clusterIP") != "None" or not ss.get("publishNotReadyAddresses"):
                errors.append(f"Service/{m.group(1)}: must be headless and publish not-ready pods")
            if not any(p["port"] == int(m.group(2)) == gossip_port and p.get("protocol") == "UDP" for p in ss["ports"]):
                errors.append(f"Service/{m.group(1)}: needs UDP port {gossip_port} matching --peer")
            if not _matches(ss.get("selector", {}), t["metadata"]["labels"]):
                errors.append(f"Service/{m.group(1)}: does not select the router pods")

    # Engines by DNS: a Service of that name, where the build has engines at all.
    disc = doc.get("discovery", {}).get("name", "")
    host, _, port = disc.rpartition(":")
    engines = [o for o in by_kind.get("Deployment", {}).values() if o is not w]
    if disc and engines:
        svc = by_kind.get("Service", {}).get(host)
        if not svc:
            errors.append(f"config discovery {disc}: no Service {host} in this build")
        elif svc["spec"].get("clusterIP") != "None" or not any(p["port"] == int(port) for p in svc["spec"]["ports"]):
            errors.append(f"Service/{host}: must be headless with port {port} for discovery")

    for pdb in by_kind.get("PodDisruptionBudget", {}).values():
        if not _matches(pdb["spec"]["selector"]["matchLabels"], t["metadata"]["labels"]):
            errors.append(f"PodDisruptionBudget/{pdb['metadata']['name']}: does not select the routers")
    nps = list(by_kind.get("NetworkPolicy", {}).values())
    if not nps:
        errors.append("no NetworkPolicy guards the gossip port")
    gossip_open = any(
        p.get("protocol") == "UDP" and p.get("port") == gossip_port
        for np in nps for rule in np["spec"].get("ingress", []) for p in rule.get("ports", []))
    if nps and not gossip_open:
        errors.append(f"NetworkPolicy blocks the mesh: no ingress rule admits UDP {gossip_port} between routers")
    for np in nps:
        if not _matches(np["spec"]["podSelector"].get("matchLabels", {}), t["metadata"]["labels"]):
            errors.append(f"NetworkPolicy/{np['metadata']['name']}: does not select the routers")
        for rule in np["spec"].get("ingress", []):
            udp = [p for p in rule.get("ports", []) if p.get("protocol") == "UDP"]
            if not udp:
                continue
            froms = rule.get("from", [])
            if not froms or any(set(f) != {"podSelector"} or not _matches(f["podSelector"].get("matchLabels", {}), t["metadata"]["labels"]) for f in froms):
                errors.append(f"NetworkPolicy/{np['metadata']['name']}: UDP ingress must come only from router pods")
            if any(p.get("port") != gossip_port for p in udp):
                errors.append(f"NetworkPolicy/{np['metadata']['name']}: UDP port is not the gossip port")
    return errors
