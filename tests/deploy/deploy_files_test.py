#!/usr/bin/env python3
"""Checks the deployment files of deploy/ with the real tools a Debian machine has:

  k8s        every manifest of deploy/k8s against the Kubernetes OpenAPI schema
             (`kubernetes-validate`, strict: unknown fields fail), for the oldest and newest
             Kubernetes versions it knows of from 1.30 on; then what the schema cannot say:
             router, prefill and decode are separate workloads, readiness on /ready and
             liveness on /health (the workers' on their metrics port), a preStop hook,
             GPU requests on the workers, Prometheus scrape annotations on each pod, ports
             that the probes and Services name exist, and every file is in kustomization.yaml.
             The PodMonitors of deploy/k8s/prometheus-operator against the Prometheus
             Operator's CRD schema (`cloudcoil-models-prometheus-operator`, unknown fields
             refused), each workload scraped by exactly one, on a port it names.
  container  deploy/container/Containerfile: every COPY source exists in the repository, every
             script a RUN names exists and is executable, every CMake target it builds exists,
             and every shared library the built binaries load is either copied by
             tools/gpu/bundle-libs.sh or belongs to a package of a Debian minbase system (the
             Essential and `required` packages, apt, and what they depend on: the contents of
             debian:12-slim). No container runtime is run here.
  install    `cmake --install BUILD --prefix TMP`: the five binaries and the systemd units land,
             ExecStart points at TMP/bin, `systemd-analyze verify` accepts every unit
             (warnings count as failures), and the router and worker 0 of each role, started
             with the command lines their units run (example env files, a tiny model, free
             ports), bring the layout up (/ready) and drain cleanly on SIGTERM.
  promtool   `promtool check config` on deploy/prometheus/prometheus.yml, and on
             prometheus-k8s.yml with its kubernetes_sd_configs swapped for static_configs
             (Debian's Prometheus is built without Kubernetes discovery), so its relabelling
             rules are still checked by promtool.

k8s, install and promtool also hand their tool a deliberately broken copy (a misspelt field, a
missing binary) and expect it refused, so that a tool that accepts everything fails the test.

    deploy_files_test.py CHECK [--build-dir BUILD]
Exits 77 (skipped) only where the tool the check needs is not installed.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
BINARIES = ["tandem", "tandem-router", "tandem-prefill-worker", "tandem-decode-worker",
            "tandem-loadgen"]
SKIP = 77


class Failures:
    def __init__(self):
        self.items = []
        self.checked = 0

    def expect(self, ok, message):
        self.checked += 1
        if not ok:
            self.items.append(message)

    def finish(self, name):
        for m in self.items:
            print("FAIL:", m)
        print(f"{name}: {self.checked - len(self.items)} passed, {len(self.items)} failed")
        return 1 if self.items else 0


def check_k8s(_):
    try:
        import kubernetes_validate
        import yaml
    except ImportError:
        print("kubernetes-validate is not installed (deploy/requirements-test.txt); skipping")
        return SKIP
    from kubernetes_validate import utils
    minor = lambda v: tuple(int(x) for x in v.split(".")[:2])
    versions = sorted({v for v in utils.all_versions() if minor(v) >= (1, 30)}, key=minor)
    versions = [versions[0], versions[-1]]
    f = Failures()
    k8s = os.path.join(DEPLOY, "k8s")
    files = sorted(glob.glob(os.path.join(k8s, "*.yaml")))
    kustomization = yaml.safe_load(open(os.path.join(k8s, "kustomization.yaml")))
    listed = set(kustomization["resources"])
    f.expect(listed == {os.path.basename(p) for p in files} - {"kustomization.yaml"},
             f"kustomization.yaml lists {sorted(listed)}")
    workloads = {}
    services = []
    for path in files:
        if path.endswith("kustomization.yaml"):
            continue
        for doc in yaml.safe_load_all(open(path)):
            name = f'{os.path.basename(path)}: {doc["kind"]}/{doc["metadata"]["name"]}'
            for v in versions:
                try:
                    kubernetes_validate.validate(doc, v, strict=True)
                    f.expect(True, name)
                except kubernetes_validate.ValidationError as e:
                    f.expect(False, f"{name} (Kubernetes {v}): {e.message} at "
                                    f"{'.'.join(str(x) for x in e.path)}")
            if doc["kind"] == "Deployment":
                workloads[doc["metadata"]["labels"]["app.kubernetes.io/component"]] = doc
            if doc["kind"] == "Service":
                services.append(doc)
    # The validator is live: a misspelt probe field and a string replica count are refused.
    import copy
    for break_it in (lambda d: d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
                     ["httpGet"].update(pth="/ready"),
                     lambda d: d["spec"].update(replicas="one")):
        broken = copy.deepcopy(workloads["router"])
        break_it(broken)
        try:
            kubernetes_validate.validate(broken, versions[-1], strict=True)
            f.expect(False, "kubernetes-validate accepted a broken Deployment")
        except kubernetes_validate.ValidationError:
            f.expect(True, "broken Deployment refused")
    f.expect(set(workloads) == {"router", "prefill", "decode"},
             f"workloads: {sorted(workloads)} (want router, prefill, decode)")
    for component, d in workloads.items():
        pod = d["spec"]["template"]
        annotations = pod["metadata"].get("annotations", {})
        c = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        f.expect(annotations.get("prometheus.io/scrape") == "true", f"{component}: scrape")
        f.expect(int(annotations.get("prometheus.io/port", 0)) in ports.values(),
                 f"{component}: prometheus.io/port is not a container port")
        f.expect("preStop" in c.get("lifecycle", {}), f"{component}: no preStop hook")
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        drain = [a for a in c.get("args", []) if a.startswith("--drain-timeout")]
        f.expect(len(drain) == 1, f"{component}: no --drain-timeout flag")
        if drain:
            seconds = float(drain[0].split("=")[1]) / (1000 if "-ms=" in drain[0] else 1)
            f.expect(grace > seconds + 5, f"{component}: grace {grace}s <= drain {seconds}s")
        for probe in ("readinessProbe", "livenessProbe"):
            get = c.get(probe, {}).get("httpGet", {})
            f.expect(get.get("port") in ports, f"{component}: {probe} port {get.get('port')}")
            want = "/ready" if probe == "readinessProbe" else "/health"
            f.expect(get.get("path") == want, f"{component}: {probe} path {get.get('path')}")
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        if component == "router":
            f.expect(gpus is None, "router must not take a GPU")
        else:
            f.expect(gpus == 1, f"{component}: nvidia.com/gpu limit {gpus}")
            f.expect("--router=tandem-router:8001" in c["args"], f"{component}: --router")
            f.expect(any(a.startswith("--advertise-host=$(POD_IP)") for a in c["args"]),
                     f"{component}: workers must advertise their pod IP")
    router_ports = {p["name"] for p in workloads["router"]["spec"]["template"]["spec"]
                    ["containers"][0]["ports"]}
    for s in services:
        for p in s["spec"]["ports"]:
            f.expect(p["targetPort"] in router_ports, f"Service port {p}")
    check_pod_monitors(f, workloads)
    print(f"kubernetes-validate schemas of Kubernetes {versions}")
    return f.finish("k8s")


def unknown_fields(given, parsed, at=""):
    """Paths of `given` (the YAML) that `parsed` (the model's dump) dropped: unknown fields."""
    if isinstance(given, dict):
        if not isinstance(parsed, dict):
            return [at or "."]
        out = []
        for k, v in given.items():
            out += ([f"{at}.{k}"] if k not in parsed else unknown_fields(v, parsed[k], f"{at}.{k}"))
        return out
    if isinstance(given, list) and isinstance(parsed, list) and len(given) == len(parsed):
        return [p for i, (g, q) in enumerate(zip(given, parsed))
                for p in unknown_fields(g, q, f"{at}[{i}]")]
    return []


def check_pod_monitors(f, workloads):
    """deploy/k8s/prometheus-operator: PodMonitors against the Prometheus Operator's CRD schema
    (the pydantic models `cloudcoil-models-prometheus-operator` generates from it: patterns,
    enums and types; unknown fields are caught by comparing the parsed object with the file),
    then that each selects pods of the workloads above by a port they name, at /metrics."""
    import copy
    import yaml
    try:
        from cloudcoil.models.prometheus_operator.v1 import PodMonitor
    except ImportError:
        f.expect(False, "cloudcoil-models-prometheus-operator is not installed "
                        "(deploy/requirements-test.txt)")
        return
    d = os.path.join(DEPLOY, "k8s", "prometheus-operator")
    kustomization = yaml.safe_load(open(os.path.join(d, "kustomization.yaml")))
    files = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*.yaml")))
    f.expect(set(kustomization["resources"]) == set(files) - {"kustomization.yaml"},
             f"prometheus-operator/kustomization.yaml lists {kustomization['resources']}")

    def validate(doc):
        """None if `doc` is a valid PodMonitor, else why not."""
        try:
            parsed = PodMonitor.model_validate(doc).model_dump(by_alias=True, exclude_unset=True,
                                                               mode="json")
        except Exception as e:  # pydantic.ValidationError
            return str(e).splitlines()[0:3]
        unknown = unknown_fields(doc, parsed)
        return f"unknown fields {unknown}" if unknown else None

    monitors = []
    for name in files:
        if name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(open(os.path.join(d, name))):
            f.expect(doc.get("kind") == "PodMonitor", f"{name}: kind {doc.get('kind')}")
            why = validate(doc)
            f.expect(why is None, f"{name}: {doc['metadata']['name']}: {why}")
            monitors.append(doc)
    # The validator is live: a misspelt field, a bad duration and a bad scheme are refused.
    for break_it in (lambda m: m["spec"].update(podMetricEndpoints=[{"port": "http"}]),
                     lambda m: m["spec"]["podMetricsEndpoints"][0].update(interval="15 s"),
                     lambda m: m["spec"]["podMetricsEndpoints"][0].update(scheme="tcp")):
        broken = copy.deepcopy(monitors[0])
        break_it(broken)
        f.expect(validate(broken) is not None, f"a broken PodMonitor was accepted: {broken}")
    # Every workload is scraped by exactly one PodMonitor, on a port its container names.
    for component, w in workloads.items():
        labels = w["spec"]["template"]["metadata"]["labels"]
        ports = {p["name"] for p in w["spec"]["template"]["spec"]["containers"][0]["ports"]}
        scraped = []
        for m in monitors:
            sel = m["spec"]["selector"]
            ok = all(labels.get(k) == v for k, v in sel.get("matchLabels", {}).items())
            for e in sel.get("matchExpressions", []):
                f.expect(e["operator"] == "In", f"{m['metadata']['name']}: operator {e}")
                ok = ok and labels.get(e["key"]) in e["values"]
            if not ok:
                continue
            for ep in m["spec"]["podMetricsEndpoints"]:
                if ep["port"] in ports:
                    scraped.append(m["metadata"]["name"])
                    f.expect(ep.get("path", "/metrics") == "/metrics", f"{component}: path")
        f.expect(len(scraped) == 1, f"{component}: scraped by PodMonitors {scraped}")


def ldd_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m and m.group(2).startswith("/"):
            libs[m.group(1)] = m.group(2)
        elif "ld-linux" in line:
            path = line.split()[0]
            libs[os.path.basename(path)] = path
    return libs


def debian_package(path):
    for candidate in (path, os.path.realpath(path)):
        r = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
        # /lib is a symlink to /usr/lib on Debian 12 (merged /usr).
        alt = candidate.replace("/usr/lib/", "/lib/", 1) if candidate.startswith("/usr/lib/") \
            else candidate.replace("/lib/", "/usr/lib/", 1)
        r = subprocess.run(["dpkg", "-S", alt], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":")[0]
    return None


def minbase_packages():
    """The packages of a Debian minbase system such as debian:12-slim (what debootstrap installs:
    Essential and `required` packages, and apt) with everything they depend on, computed from
    the installed packages' control fields."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Essential}\t${Priority}\t"
                          "${Pre-Depends}, ${Depends}\n"], capture_output=True, text=True,
                         check=True).stdout
    deps, seeds = {}, {"apt"}
    for line in out.splitlines():
        name, essential, priority, depends = line.split("\t")
        # First alternative of each dependency, without version or architecture qualifiers.
        deps[name] = [re.split(r"[ :(]", d.strip().split("|")[0].strip())[0]
                      for d in depends.split(",") if d.strip()]
        if essential == "yes" or priority == "required":
            seeds.add(name)
    seen, todo = set(), list(seeds)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(deps.get(p, []))
    return seen


def check_container(args):
    f = Failures()
    path = os.path.join(DEPLOY, "container", "Containerfile")
    text = open(path).read()
    # Logical lines (backslash continuations joined), comments dropped.
    lines = [l for l in re.sub(r"\\\n", " ", text).splitlines()
             if l.strip() and not l.lstrip().startswith("#")]
    stages = [l for l in lines if l.startswith("FROM ")]
    f.expect(len(stages) == 2 and stages[0].startswith("FROM debian:12 AS")
             and stages[1].startswith("FROM debian:12-slim"),
             f"stages: {stages} (want debian:12 build, debian:12-slim runtime)")
    for l in lines:
        if l.startswith("COPY ") and "--from=" not in l:
            sources = l.split()[1:-1]
            for s in sources:
                f.expect(s == "." or os.path.exists(os.path.join(ROOT, s)),
                         f"COPY source {s} does not exist")
        if l.startswith("RUN "):
            for script in re.findall(r"(?:\./)?((?:deploy|tools)/[\w./-]+\.sh)", l):
                p = os.path.join(ROOT, script)
                f.expect(os.access(p, os.X_OK), f"RUN names {script}: missing or not executable")
            for targets in re.findall(r"--target ([\w -]+?)(?:&&|$)", l):
                print("Containerfile builds:", targets.strip())
                for t in targets.split():
                    found = subprocess.run(["grep", "-rqE", rf"add_executable\({t}( |$)",
                                            "--include=CMakeLists.txt", ROOT]).returncode == 0
                    f.expect(found, f"CMake target {t} not found")
    # `docker run -p` reaches only a listener on the container's interfaces, not its loopback.
    cmd = [l for l in lines if l.startswith("CMD ")]
    f.expect(cmd == ['CMD ["serve", "--host", "0.0.0.0"]'],
             f"default command {cmd}: want serve --host 0.0.0.0 (reachable through -p)")
    copy_from = [l for l in lines if l.startswith("COPY --from=build")]
    f.expect(copy_from == ["COPY --from=build /opt/tandem /opt/tandem"],
             f"runtime copies {copy_from}")
    # The runtime has the libraries the binaries load: bundled, or in a `required` package.
    bin_dir = os.path.join(args.build_dir, "bin")
    bundle = subprocess.run(["bash", "-c", "grep -E \"^(system|gpu)_libs=\" "
                             + os.path.join(ROOT, "tools/gpu/bundle-libs.sh")],
                            capture_output=True, text=True).stdout
    left_out = [re.compile(m) for m in re.findall(r"='(.*)'", bundle)]
    f.expect(len(left_out) == 2, "bundle-libs.sh's library filters not found")
    checked = {}
    base = minbase_packages()
    # The image builds with TANDEM_CUDA=OFF; a build directory with CUDA on (CI's, where nvcc
    # exists) links the CUDA runtime libraries too, which the CPU image's binaries do not load.
    cuda_runtime = re.compile(r"^lib(cudart|cublas|cublasLt|nccl|cuda)\.so")
    skipped_cuda = set()
    for b in BINARIES:
        p = os.path.join(bin_dir, b)
        if not os.path.exists(p):
            f.expect(False, f"{p} not built")
            continue
        for name, lib in ldd_libraries(p).items():
            if cuda_runtime.search(name):
                skipped_cuda.add(name)
                continue
            if any(r.search(name) for r in left_out):
                if name not in checked:
                    pkg = debian_package(lib)
                    checked[name] = (pkg,)
                    f.expect(pkg in base,
                             f"{b}: {name} ({lib}) is left out by bundle-libs.sh but its package "
                             f"{pkg} is not in a minbase system such as debian:12-slim")
    print(f"libraries left to the runtime base: "
          + ", ".join(f"{n} ({p[0]})" for n, p in sorted(checked.items())))
    if skipped_cuda:
        print("not checked (a CUDA build's libraries; the image builds with TANDEM_CUDA=OFF): "
              + ", ".join(sorted(skipped_cuda)))
    return f.finish("container")


def check_install(args):
    if shutil.which("systemd-analyze") is None:
        print("systemd-analyze is not installed (Debian package `systemd`); skipping")
        return SKIP
    f = Failures()
    with tempfile.TemporaryDirectory(prefix="tandem-install-") as prefix:
        r = subprocess.run(["cmake", "--install", args.build_dir, "--prefix", prefix],
                           capture_output=True, text=True)
        f.expect(r.returncode == 0, f"cmake --install failed: {r.stdout}{r.stderr}")
        for b in BINARIES:
            p = os.path.join(prefix, "bin", b)
            f.expect(os.access(p, os.X_OK), f"{p} not installed")
        unit_dir = os.path.join(prefix, "lib", "systemd", "system")
        units = sorted(os.listdir(unit_dir)) if os.path.isdir(unit_dir) else []
        want = ["tandem-decode-worker@.service", "tandem-prefill-worker@.service",
                "tandem-router.service", "tandem.target"]
        f.expect(units == want, f"units {units}, want {want}")
        f.expect(os.path.exists(os.path.join(prefix, "share", "tandem", "layouts",
                                             "default.yaml")), "layouts not installed")
        verify = []
        for u in units:
            text = open(os.path.join(unit_dir, u)).read()
            f.expect("@TANDEM_" not in text, f"{u}: an @TANDEM_...@ left unsubstituted")
            for exe in re.findall(r"^ExecStart=(\S+)", text, re.M):
                f.expect(exe == os.path.join(prefix, "bin", os.path.basename(exe)),
                         f"{u}: ExecStart {exe} is not under {prefix}/bin")
            if u.endswith("@.service"):  # verify an instance of each template
                inst = os.path.join(unit_dir, u.replace("@.", "@0."))
                shutil.copy(os.path.join(unit_dir, u), inst)
                verify.append(inst)
            else:
                verify.append(os.path.join(unit_dir, u))
        r = subprocess.run(["systemd-analyze", "verify", "--man=no"] + verify,
                           capture_output=True, text=True, timeout=60)
        messages = (r.stdout + r.stderr).strip()
        f.expect(r.returncode == 0 and not messages,
                 f"systemd-analyze verify (rc {r.returncode}): {messages}")
        print(f"systemd-analyze verify: {[os.path.basename(v) for v in verify]}")
        run_layout_from_units(f, args, prefix, unit_dir)
        # ... and it is live: a unit whose binary is missing, or with a misspelt key, fails.
        router_unit = open(os.path.join(unit_dir, "tandem-router.service")).read()
        for name, text in (("missing-binary.service",
                            router_unit.replace("/bin/tandem-router", "/bin/no-such-binary")),
                           ("misspelt-key.service", router_unit.replace("Restart=", "Restrat="))):
            bad = os.path.join(prefix, name)
            with open(bad, "w") as out:
                out.write(text)
            r = subprocess.run(["systemd-analyze", "verify", "--man=no", bad],
                               capture_output=True, text=True, timeout=60)
            f.expect(r.returncode != 0 or (r.stdout + r.stderr).strip(),
                     f"systemd-analyze verify accepted {name} silently")
    return f.finish("install")


def read_env_file(path):
    env = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def expand_exec_start(unit_text, instance, env):
    """ExecStart= as systemd runs it: %i the instance, ${VAR} one word, $VAR split on spaces."""
    line = re.search(r"^ExecStart=(.*)$", unit_text, re.M).group(1).replace("%i", instance)
    argv = []
    for word in line.split():
        m = re.fullmatch(r"\$\{(\w+)\}|\$(\w+)", word)
        if m and m.group(1):
            argv.append(env[m.group(1)])
        elif m:
            argv.extend(env.get(m.group(2), "").split())
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda v: env[v.group(1)], word))
    return argv


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout_from_units(f, args, prefix, unit_dir):
    """Starts the installed router and worker 0 of each role with the command lines their units
    run (the example environment files, with a tiny model and free ports), and expects the
    router's /ready within 60 s, then a clean drain on SIGTERM: the units' flags are ones the
    binaries accept and the layout they describe comes up."""
    import signal
    import secrets
    import urllib.request
    model = os.path.join(prefix, "tiny")
    r = subprocess.run([os.path.join(prefix, "bin", "tandem"), "make-model", "--preset", "tiny",
                        "--out", model], capture_output=True, text=True)
    f.expect(r.returncode == 0, f"make-model: {r.stderr}")
    env_dir = os.path.join(prefix, "share", "tandem", "systemd")
    base = read_env_file(os.path.join(env_dir, "tandem.env"))
    grpc = free_port()
    base.update(TANDEM_MODEL=model, TANDEM_ROUTER_HOST="127.0.0.1",
                TANDEM_ROUTER_PORT=str(free_port()), TANDEM_ROUTER_GRPC_PORT=str(grpc),
                TANDEM_ROUTER=f"127.0.0.1:{grpc}")
    runs = [("tandem-router.service", "", base)]
    for role in ("prefill", "decode"):
        env = dict(base, **read_env_file(os.path.join(env_dir, f"{role}-0.env")))
        env.update(TANDEM_WORKER_PORT=str(free_port()), TANDEM_METRICS_PORT=str(free_port()),
                   TANDEM_KV_PORT=str(free_port()), CUDA_VISIBLE_DEVICES="",
                   TANDEM_WORKER_ARGS="--backend cpu --kv-memory-bytes 16777216")
        runs.append((f"tandem-{role}-worker@.service", "0", env))
    token = secrets.token_hex(32)
    procs = []
    try:
        for unit, instance, env in runs:
            argv = expand_exec_start(open(os.path.join(unit_dir, unit)).read(), instance, env)
            # As /etc/tandem/cluster-token.env (EnvironmentFile of every unit) would set it.
            procs.append((unit, subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                 stderr=subprocess.PIPE, text=True,
                                                 env=dict(os.environ, TANDEM_CLUSTER_TOKEN=token))))
        url = f"http://127.0.0.1:{base['TANDEM_ROUTER_PORT']}/ready"
        ready = False
        deadline = time.time() + 60
        while not ready and time.time() < deadline and all(p.poll() is None for _, p in procs):
            try:
                ready = urllib.request.urlopen(url, timeout=2).status == 200
            except OSError:
                time.sleep(0.2)
        exited = [f"{u} exited {p.returncode}: {p.stderr.read()[-400:]}"
                  for u, p in procs if p.poll() is not None]
        f.expect(ready, f"the layout of the units did not become ready: {exited}")
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for u, p in procs:
            try:
                f.expect(p.wait(timeout=20) == 0, f"{u}: exit code {p.returncode} after SIGTERM")
            except subprocess.TimeoutExpired:
                p.kill()
                f.expect(False, f"{u} did not stop within 20 s of SIGTERM")
    print("the units' command lines brought up router + prefill-0 + decode-0 and drained")


def check_promtool(_):
    if shutil.which("promtool") is None:
        print("promtool is not installed (Debian package `prometheus`); skipping")
        return SKIP
    f = Failures()
    prom = os.path.join(DEPLOY, "prometheus")
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "targets"))
        shutil.copy(os.path.join(prom, "prometheus.yml"), d)
        with open(os.path.join(d, "targets", "tandem.json"), "w") as t:
            t.write('[{"targets": ["127.0.0.1:8000"], "labels": {"tandem_role": "router"}}]')
        k8s = open(os.path.join(prom, "prometheus-k8s.yml")).read()
        f.expect("kubernetes_sd_configs:\n      - role: pod\n" in k8s, "k8s discovery block")
        with open(os.path.join(d, "prometheus-k8s.yml"), "w") as t:
            t.write(k8s.replace("kubernetes_sd_configs:\n      - role: pod\n",
                                "static_configs:\n      - targets: ['127.0.0.1:8000']\n"))
        for name in ("prometheus.yml", "prometheus-k8s.yml"):
            r = subprocess.run(["promtool", "check", "config", os.path.join(d, name)],
                               capture_output=True, text=True)
            out = r.stdout + r.stderr
            f.expect(r.returncode == 0 and "WARNING" not in out, f"{name}: {out}")
            print(out.strip())
        # promtool is live: an unknown field fails.
        with open(os.path.join(d, "bad.yml"), "w") as t:
            t.write(open(os.path.join(prom, "prometheus.yml")).read().replace(
                "metrics_path:", "metric_path:"))
        r = subprocess.run(["promtool", "check", "config", os.path.join(d, "bad.yml")],
                           capture_output=True, text=True)
        f.expect(r.returncode != 0, "promtool accepted an unknown field")
    return f.finish("promtool")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=["k8s", "container", "install", "promtool"])
    p.add_argument("--build-dir", default=os.environ.get("TANDEM_BINARY_DIR", "build"))
    a = p.parse_args()
    return {"k8s": check_k8s, "container": check_container, "install": check_install,
            "promtool": check_promtool}[a.check](a)


if __name__ == "__main__":
    sys.exit(main())
