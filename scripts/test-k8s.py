#!/usr/bin/env python3
"""Checks the Kubernetes manifests in deploy/k8s (issue 14, item 4) without a cluster.

For every manifest holding an indexed Job, it works out the environment each pod gets the way
Kubernetes would (plain values; the downward API's completion-index annotation and pod IP; the
Secret reference) and checks the rank rule: pod i has SYNKV_RANK=i, SYNKV_WORLD_SIZE equals the
completions and the parallelism, SYNKV_ROOT_ADDR names pod 0 through the headless Service that
the pod template's subdomain points at, SYNKV_ROOT_PORT is a port of that Service and of the
container, SYNKV_NODE_HOST is the pod IP and SYNKV_SECRET comes from a Secret. Then it runs the
pods' command on this machine, one process per pod with exactly that environment (the pod IPs and
pod 0's DNS name replaced by 127.0.0.1, the port by a free one, `synkv` by the built binary), so
synkv's own orchestrator detection decides each process's role: every process must exit 0 with
its "selftest t24 ok (rank i of N workers, N servers)" line.

Usage: python3 scripts/test-k8s.py [SYNKV_BINARY]  (default: $SYNKV_BIN, else cargo's debug build)
Needs PyYAML (falls back to Debian's /usr/bin/python3; skips with a message if neither has it).
"""
import os
import subprocess
import sys
import tempfile
import time

try:
    import yaml
except ImportError:
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    print("SKIPPED (k8s): PyYAML is not installed (pip install pyyaml, or apt-get install python3-yaml)")
    sys.exit(0)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INDEX_ANNOTATION = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
JOB_PREFIXES = ("SYNKV_", "DMLC_", "MXNET_", "PS_", "PET_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_")
JOB_NAMES = {"PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"}

passed = 0
failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name}{': ' + detail if detail else ''}")
    return ok


def pod_env(container, index, pod_ip, secrets):
    """The environment Kubernetes gives `container` in the pod of completion index `index`."""
    env = {}
    for e in container.get("env", []):
        name = e["name"]
        if "value" in e:
            env[name] = str(e["value"])
            continue
        src = e["valueFrom"]
        if "fieldRef" in src:
            path = src["fieldRef"]["fieldPath"]
            if path == INDEX_ANNOTATION:
                env[name] = str(index)
            elif path == "status.podIP":
                env[name] = pod_ip
            else:
                raise ValueError(f"{name}: unexpected fieldRef {path}")
        elif "secretKeyRef" in src:
            ref = src["secretKeyRef"]
            env[name] = secrets[(ref["name"], ref["key"])]
        else:
            raise ValueError(f"{name}: unexpected valueFrom {src}")
    return env


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "synkv-python", "python", "tests"))
from ports import free_port  # noqa: E402  (below the ephemeral range: nothing else takes it)


def check_manifest(path, synkv):
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    jobs = [d for d in docs if d["kind"] == "Job" and d["spec"].get("completionMode") == "Indexed"]
    rel = os.path.relpath(path, ROOT)
    if not jobs:
        return
    for job in jobs:
        jname = job["metadata"]["name"]
        spec = job["spec"]
        tmpl = spec["template"]
        pod = tmpl["spec"]
        n = spec["completions"]
        label = f"{rel} job {jname}"
        check(f"{label}: parallelism = completions = {n} (every rank runs at once)", spec.get("parallelism") == n)
        check(f"{label}: restartPolicy Never, backoffLimit 0 (hosted roles cannot restart)",
              pod.get("restartPolicy") == "Never" and spec.get("backoffLimit") == 0)
        sub = pod.get("subdomain")
        svc = services.get(sub)
        if not check(f"{label}: subdomain {sub!r} is a Service of the manifest", svc is not None):
            continue
        check(f"{label}: Service {sub} is headless and publishes not-ready addresses",
              svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses") is True)
        pod_labels = dict(tmpl.get("metadata", {}).get("labels", {}))
        pod_labels.setdefault("job-name", jname)  # the Job controller adds it
        selector = svc["spec"].get("selector", {})
        check(f"{label}: Service {sub} selects the Job's pods", selector and all(pod_labels.get(k) == v for k, v in selector.items()),
              f"selector {selector}, pod labels {pod_labels}")
        (container,) = pod["containers"]
        secret_refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
        secrets = {(r["name"], r["key"]): "k8s-test-secret" for r in secret_refs}
        envs = [pod_env(container, i, f"10.0.0.{i + 1}", secrets) for i in range(n)]
        ok = True
        for i, env in enumerate(envs):
            want = {
                "SYNKV_RANK": str(i),
                "SYNKV_WORLD_SIZE": str(n),
                "SYNKV_ROOT_ADDR": f"{jname}-0.{sub}",
                "SYNKV_NODE_HOST": f"10.0.0.{i + 1}",
                "SYNKV_SECRET": "k8s-test-secret",
            }
            bad = {k: (env.get(k), v) for k, v in want.items() if env.get(k) != v}
            ok = check(f"{label}: pod {i} env (rank, world size, root address, pod IP, secret)", not bad, f"(got, want) {bad}") and ok
        check(f"{label}: SYNKV_SECRET from a Secret (secretKeyRef), never a literal",
              any(e["name"] == "SYNKV_SECRET" and "secretKeyRef" in e.get("valueFrom", {}) for e in container["env"]))
        text = open(path).read()
        check(f"{label}: each Secret referenced is the one the header's kubectl command creates",
              secret_refs and all(f"kubectl create secret generic {r['name']} --from-literal={r['key']}=" in text for r in secret_refs),
              f"{secret_refs}")
        port = int(envs[0].get("SYNKV_ROOT_PORT", "0"))
        check(f"{label}: SYNKV_ROOT_PORT {port} is a port of Service {sub} and of the container",
              any(p.get("port") == port and p.get("targetPort", port) == port for p in svc["spec"].get("ports", []))
              and any(p.get("containerPort") == port for p in container.get("ports", [])))
        check(f"{label}: no DMLC_PS_ROOT_URI (it would turn the orchestrator detection off)",
              all("DMLC_PS_ROOT_URI" not in e for e in envs))
        if ok:
            run_pods(label, container, envs, synkv, n)


def run_pods(label, container, envs, synkv, n):
    """Runs the pods' command here, one process per pod with its environment (addresses made local)."""
    argv = list(container.get("command", [])) + list(container.get("args", []))
    if not argv or argv[0] != "synkv":
        print(f"note {label}: the command is not synkv's, so it is not run here")
        return
    argv[0] = synkv
    base = {k: v for k, v in os.environ.items() if k not in JOB_NAMES and not k.startswith(JOB_PREFIXES)}
    base.update({"SYNKV_HEARTBEAT_INTERVAL_MS": "200", "SYNKV_HEARTBEAT_TIMEOUT_MS": "2000", "SYNKV_TIMEOUT_MS": "30000",
                 "SYNKV_PARTITION_BYTES": "1048576", "SYNKV_LOG": "warn"})
    port = str(free_port())
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, env in enumerate(envs):
            e = dict(base)
            e.update(env)
            e.update({"SYNKV_ROOT_ADDR": "127.0.0.1", "SYNKV_NODE_HOST": "127.0.0.1", "SYNKV_ROOT_PORT": port})
            out = open(os.path.join(tmp, f"pod{i}.out"), "w+")
            procs.append((subprocess.Popen(argv, env=e, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), out))
        deadline = time.monotonic() + 120
        for i, (p, out) in enumerate(procs):
            try:
                st = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                st = None
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for i, (p, out) in enumerate(procs):
            out.seek(0)
            text = out.read()
            line = f"selftest t24 ok (rank {i} of {n} workers, {n} servers)"
            check(f"{label}: pod {i}'s command with its env, run here, exits 0 with {line!r}",
                  p.returncode == 0 and line in text, f"exit {p.returncode}:\n{text}")


def main():
    synkv = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SYNKV_BIN")
    if not synkv:
        subprocess.run(["cargo", "build", "-q", "-p", "synkv-cli"], cwd=ROOT, check=True)
        synkv = os.path.join(ROOT, "target", "debug", "synkv")
    kdir = os.path.join(ROOT, "deploy", "k8s")
    manifests = sorted(os.path.join(kdir, f) for f in os.listdir(kdir) if f.endswith((".yaml", ".yml")))
    check("deploy/k8s has manifests", bool(manifests))
    for m in manifests:
        check_manifest(m, synkv)
    print(f"k8s: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
