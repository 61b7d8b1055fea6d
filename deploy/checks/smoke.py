"""Loopback smoke test of the Kubernetes manifests with the real binaries.

Runs what the kubelet would run for the demo overlay, on 127.0.0.0/8 only: the router
pods' init container script and serve arguments exactly as rendered (downward-API
variables expanded, mount paths mapped to temporary directories), the emulator's
arguments, the Containerfile's HEALTHCHECK command. DNS names of Services are replaced
by the loopback addresses they would resolve to. Passing means: the init container
issues a certificate the router accepts, two routers form a mesh over mutual TLS, they
discover the engine, become ready and route a completion.

Every process is started in its own process group and killed on every exit path.
"""

import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .report import CheckError, Skip, require

NAMESPACE = "headroom"


def find_binary(repo, name):
    """A built binary: $HEADROOM_BIN_DIR, then $CARGO_TARGET_DIR/target, newest first."""
    dirs = []
    if os.environ.get("HEADROOM_BIN_DIR"):
        dirs.append(Path(os.environ["HEADROOM_BIN_DIR"]))
    target = Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
    dirs += [target / "release", target / "debug"]
    found = [d / name for d in dirs if (d / name).is_file() and os.access(d / name, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


class Procs:
    """Started processes; all are killed (whole process group) on close."""

    def __init__(self, logdir):
        self.procs, self.logdir = [], logdir

    def start(self, label, argv, env=None):
        log = open(self.logdir / f"{label}.log", "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        self.procs.append((label, p))
        return p

    def tail(self, label, n=15):
        path = self.logdir / f"{label}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n          ".join(re.sub(r"\x1b\[[0-9;]*m", "", l) for l in lines[-n:])

    def close(self):
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for _, p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def http(url, body=None, timeout=2.0):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 headers={"content-type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (urllib.error.URLError, OSError):
        return None, {}, b""


def wait_for(what, fn, timeout, procs, labels):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fn():
            return
        for label, p in procs.procs:
            if label in labels and p.poll() is not None:
                raise CheckError(f"{label} exited ({p.returncode}) while waiting for {what}:\n          {procs.tail(label)}")
        time.sleep(0.2)
    raise CheckError(f"timed out after {timeout}s waiting for {what}:\n          " +
                     "\n          ".join(f"[{l}] {procs.tail(l, 6)}" for l in labels))


class Pod:
    """One pod of a rendered template, mapped onto a temporary directory."""

    def __init__(self, template, name, ip, root, binary_dir):
        self.spec, self.name, self.ip = template["spec"], name, ip
        self.root = root / name
        self.vols = {v["name"]: v for v in self.spec.get("volumes", [])}
        self.binary_dir = binary_dir

    def vol_dir(self, name):
        d = self.root / "volumes" / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def env(self, c):
        field = {"metadata.name": self.name, "metadata.namespace": NAMESPACE, "status.podIP": self.ip}
        out = {}
        for e in c.get("env", []):
            if "value" in e:
                out[e["name"]] = e["value"]
            else:
                out[e["name"]] = field[e["valueFrom"]["fieldRef"]["fieldPath"]]
        return out

    def paths(self, c, text):
        """Container paths in text mapped onto this pod's volume directories."""
        for m in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
            text = text.replace(m["mountPath"], str(self.vol_dir(m["name"])))
        return text

    def argv(self, c, rewrites=()):
        env = self.env(c)
        out = []
        for s in c.get("command", []) + c.get("args", []):
            s = self.paths(c, re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), s))
            for old, new in rewrites:
                s = s.replace(old, new)
            out.append(s)
        return out

    def proc_env(self, c):
        env = {"PATH": f"{self.binary_dir}:/usr/bin:/bin", "RUST_BACKTRACE": "0"}
        env.update(self.env(c))
        return env


def _certs_secret(headroom, tmp):
    """The Secret `headroom-mesh-ca` as deploy/README.md tells the operator to make it."""
    src = tmp / "mesh-ca-src"
    out = subprocess.run([str(headroom), "certs", "--dir", str(src), "--node", "bootstrap"],
                         capture_output=True, text=True, timeout=30)
    require(out.returncode == 0, f"headroom certs failed: {out.stderr}")
    return {"ca.pem": (src / "ca.pem").read_bytes(), "ca.key": (src / "ca.key").read_bytes()}


def _openssl_ca(tmp):
    """A CA as cert-manager would hold it (issuer for the CSI driver's leaves)."""
    if not shutil.which("openssl"):
        raise Skip("openssl is not installed")
    d = tmp / "csi-ca"
    d.mkdir()
    run = lambda *a, **kw: subprocess.run(a, cwd=d, check=True, capture_output=True, timeout=30, **kw)
    run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key")
    run("openssl", "req", "-new", "-x509", "-key", "ca.key", "-subj", "/CN=headroom-mesh-ca", "-days", "2",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", "ca.crt")
    return d


def _csi_files(ca_dir, pod_name, dest):
    """What csi.cert-manager.io mounts for the component's attributes: ca.crt, tls.crt,
    tls.key with CN and the only DNS SAN equal to the pod name, server+client auth."""
    run = lambda *a: subprocess.run(a, cwd=dest, check=True, capture_output=True, timeout=30)
    ext = dest / "leaf.ext"
    ext.write_text(f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:{pod_name}\n")
    run("openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "tls.key")
    run("openssl", "req", "-new", "-key", "tls.key", "-subj", f"/CN={pod_name}", "-out", "leaf.csr")
    run("openssl", "x509", "-req", "-in", "leaf.csr", "-CA", str(ca_dir / "ca.crt"), "-CAkey",
        str(ca_dir / "ca.key"), "-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", "tls.crt")
    shutil.copy(ca_dir / "ca.crt", dest / "ca.crt")
    for f in ("leaf.csr", "leaf.ext"):
        (dest / f).unlink()


def run_mesh(objs, repo, deploy, headroom, replica, variant):
    """variant: 'ca-secret' (base init container) or 'csi' (cert-manager CSI component)."""
    from . import containerfile

    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    router_t = by[("Deployment", "headroom")]["spec"]["template"]
    emu_t = by[("Deployment", "replica-h100")]["spec"]["template"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("headroom-config"))
    net = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}"
    engine_ip, pod_ips = f"{net}.10", [f"{net}.21", f"{net}.22"]
    names = [f"headroom-smoke-{variant}-a", f"headroom-smoke-{variant}-b"]
    tmp = Path(tempfile.mkdtemp(prefix="headroom-deploy-smoke-"))
    procs = Procs(tmp)
    try:
        # The engine, as the demo overlay runs it (faster than real time).
        ec = emu_t["spec"]["containers"][0]
        epod = Pod(emu_t, "replica-smoke", engine_ip, tmp, replica.parent)
        eargv = [str(replica)] + epod.argv(ec, [("0.0.0.0:", f"{engine_ip}:")])[0:] + ["--time-scale", "0.05"]
        procs.start("engine", eargv, epod.proc_env(ec))
        wait_for("the engine's /health", lambda: http(f"http://{engine_ip}:8000/health")[0] == 200, 20, procs, {"engine"})

        secret = _certs_secret(headroom, tmp) if variant == "ca-secret" else None
        csi_ca = _openssl_ca(tmp) if variant == "csi" else None
        # DNS: the peer Service resolves to the router pods, the engine Service to the engine.
        dns = [(f"headroom-mesh.{NAMESPACE}.svc.cluster.local:7946", f"{pod_ips[0]}:7946"),
               ("headroom-replicas:8000", f"{engine_ip}:8000")]
        for name, ip in zip(names, pod_ips):
            pod = Pod(router_t, name, ip, tmp, headroom.parent)
            c = next(c for c in pod.spec["containers"] if c["name"] == "headroom")
            for vname, v in pod.vols.items():
                d = pod.vol_dir(vname)
                if "configMap" in v:
                    for k, text in cm["data"].items():
                        for old, new in dns + [('"0.0.0.0:', f'"{ip}:')]:
                            text = text.replace(old, new)
                        (d / k).write_text(pod.paths(c, text))
                elif "secret" in v:
                    for item in v["secret"]["items"]:
                        (d / item["path"]).write_bytes(secret[item["key"]])
                elif "csi" in v:
                    _csi_files(csi_ca, name, d)
            for ic in pod.spec.get("initContainers", []):
                out = subprocess.run(pod.argv(ic), env=pod.proc_env(ic), capture_output=True, text=True, timeout=30)
                require(out.returncode == 0, f"{name}: init container {ic['name']} failed: {out.stderr.strip()}")
            argv = pod.argv(c, dns)
            require(argv[0] == "serve", f"router args must start with `serve`: {argv}")
            procs.start(name, [str(headroom)] + argv, pod.proc_env(c))

        hc = containerfile.healthcheck_command(deploy)
        for name, ip in zip(names, pod_ips):
            cmd = [a.replace("127.0.0.1", ip) for a in hc]

            def healthy(cmd=cmd):
                env = {"HEADROOM_HTTP_PORT": "8080", "PATH": "/usr/bin:/bin"}
                return subprocess.run(cmd, env=env, capture_output=True, timeout=5).returncode == 0

            wait_for(f"{name}: the image's HEALTHCHECK command", healthy, 20, procs, {name})

        def meshed():
            for ip in pod_ips:
                st, _, body = http(f"http://{ip}:8080/debug/cluster")
                if st != 200:
                    return False
                live = {m["node_id"] for m in json.loads(body).get("members", []) if m.get("live")}
                if live != set(names):
                    return False
            return True

        wait_for("both routers to list each other as live mesh members", meshed, 25, procs, set(names))
        for name, ip in zip(names, pod_ips):
            wait_for(f"{name}: /ready", lambda ip=ip: http(f"http://{ip}:8080/ready")[0] == 200, 20, procs, {name})
        st, headers, body = http(f"http://{pod_ips[1]}:8080/v1/completions",
                                 {"model": "llama-3-8b", "prompt": "hello mesh", "max_tokens": 4}, timeout=20)
        require(st == 200, f"completion through {names[1]}: HTTP {st}: {body[:300]!r}")
        served = {k.lower(): v for k, v in headers.items()}.get("x-headroom-replica")
        require(served is not None, "completion response lacks x-headroom-replica")
        return f"2 routers meshed over mTLS, ready, routed to {served}"
    finally:
        procs.close()
        shutil.rmtree(tmp, ignore_errors=True)
