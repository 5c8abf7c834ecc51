"""deploy/: the container file and the Kubernetes manifests, checked as far as
a machine without a cluster allows: they parse, agree with each other, and
name only what the server really has (its flags, ports, probe paths, metrics,
KV event topic and layout, the libraries its binary links)."""
import re
import shlex
import subprocess
import time
from pathlib import Path

import msgspec
import pytest
import yaml
import zmq

from harness import CLI, REPO, STORIES

DEPLOY = REPO / "deploy"


def docs():
    out = {}
    for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            assert d and "kind" in d and "metadata" in d, f"{f.name}: a document without kind or metadata"
            key = (d["kind"], d["metadata"]["name"])
            assert key not in out, f"{key} defined twice"
            out[key] = d
    return out


def container(deployment):
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def arg_value(args, flag):
    return args[args.index(flag) + 1]


def serve_flags():
    """Every long flag `tandem serve --help` lists."""
    out = subprocess.run([CLI, "serve", "--help"], capture_output=True, text=True, timeout=60).stdout
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", out))


def test_manifests_agree_with_each_other():
    d = docs()
    dep = d[("Deployment", "tandem")]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    c = container(dep)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    args = c["args"]
    assert args[0] == "serve"
    assert int(arg_value(args, "--port")) == ports["http"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] in ports
    svc = d[("Service", "tandem")]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] in ports
    pool = d[("InferencePool", "tandem")]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports["http"]]
    epp_ref = pool["spec"]["endpointPickerRef"]
    epp_svc = d[("Service", epp_ref["name"])]
    assert epp_ref["port"]["number"] in [p["port"] for p in epp_svc["spec"]["ports"]]
    # The pods publish KV events to the picker's ZeroMQ port, through its Service.
    events = arg_value(args, "--kv-events")
    host, port = re.match(r"tcp://([a-z0-9-]+):(\d+)$", events).groups()
    assert host == epp_ref["name"] and int(port) in [p["port"] for p in epp_svc["spec"]["ports"]]
    epp = d[("Deployment", epp_ref["name"])]
    assert "zmq" in {p["name"]: p for p in container(epp)["ports"]}
    epp_cfg = yaml.safe_load(d[("ConfigMap", "tandem-epp")]["data"]["epp-config.yaml"])
    scorer = next(p for p in epp_cfg["plugins"] if p["type"] == "precise-prefix-cache-scorer")["parameters"]
    assert scorer["kvEventsConfig"]["zmqEndpoint"] == f"tcp://*:{port}"
    assert arg_value(args, "--kv-events-topic").startswith(scorer["kvEventsConfig"]["topicFilter"])
    assert epp["spec"]["template"]["spec"]["serviceAccountName"] == "tandem-epp"
    route = d[("HTTPRoute", "tandem")]
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["kind"], backend["name"]) == ("InferencePool", "tandem")


def test_the_deployment_runs_as_written():
    """The Deployment's own arguments start a server that answers the probes,
    has every metric the endpoint picker reads, and publishes KV events in the
    layout, topic, block size and hash seed the picker's config expects."""
    d = docs()
    c = container(d[("Deployment", "tandem")])
    args = list(c["args"])
    flags = serve_flags()
    for a in args:
        if a.startswith("--"):
            assert a in flags, f"tandem serve has no {a}"
    # What differs on this machine: the model, the address, and a KV events
    # endpoint this test can subscribe to (the picker binds it in the cluster).
    args[args.index("-m") + 1] = STORIES
    args[args.index("--ctx-size") + 1] = "512"  # the tiny model's context
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = "0"
    args[args.index("--kv-events") + 1] = "tcp://127.0.0.1:*"
    args = [a.replace("$(POD_IP)", "10.1.2.3") for a in args]  # as Kubernetes expands it
    log = Path(REPO / "build" / "test-deploy-serve.log")
    proc = subprocess.Popen([CLI, *args, "-t", "1"], stderr=open(log, "w"), stdout=subprocess.DEVNULL)
    ctx = zmq.Context()
    try:
        deadline = time.monotonic() + 60
        while not re.search(r"KV events on (tcp://[0-9.:]+)", log.read_text()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        text = log.read_text()
        port = int(re.search(r"on http://127\.0\.0\.1:(\d+)", text).group(1))
        endpoint = re.search(r"KV events on (tcp://[0-9.:]+)", text).group(1)
        import http.client
        import json

        def get(path, body=None):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST" if body is not None else "GET", path, json.dumps(body) if body is not None else None,
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read().decode()

        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert get(c[probe]["httpGet"]["path"])[0] == 200
        status, metrics = get("/metrics")
        assert status == 200
        epp_args = container(d[("Deployment", "tandem-epp")])["args"]
        for flag in ("--total-queued-requests-metric", "--total-running-requests-metric",
                     "--kv-cache-usage-percentage-metric", "--cache-info-metric"):
            name = arg_value(epp_args, flag)
            assert re.search(rf"^{re.escape(name)}[{{ ]", metrics, re.M), f"/metrics has no {name}"
        epp_cfg = yaml.safe_load(d[("ConfigMap", "tandem-epp")]["data"]["epp-config.yaml"])
        tp = next(p for p in epp_cfg["plugins"]
                  if p["type"] == "precise-prefix-cache-scorer")["parameters"]["indexerConfig"]["tokenProcessorConfig"]
        block = int(re.search(r'vllm:cache_config_info\{block_size="(\d+)"', metrics).group(1))
        assert block == tp["blockSize"]

        # The events as llm-d's indexer reads them: topic kv@POD_IP@MODEL, arrays.
        sub = ctx.socket(zmq.SUB)
        sub.connect(endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        stored = None
        deadline = time.monotonic() + 30
        while stored is None:
            assert time.monotonic() < deadline, "no BlockStored event arrived"
            assert get("/v1/completions", {"prompt": "Once upon a time there was a little girl named Lily who "
                                           "loved to play outside in the sun", "max_tokens": 2})[0] == 200
            get("/reset_prefix_cache", {})  # the next request stores its blocks again
            while sub.poll(300):
                topic, _, payload = sub.recv_multipart()
                assert topic == b"kv@10.1.2.3@gemma-3-270m"
                ts, events, *rank = msgspec.msgpack.decode(payload)
                for ev in events:
                    assert isinstance(ev, list), "llm-d reads events as arrays"
                    if ev[0] == "BlockStored":
                        stored = ev
        tokens = stored[3]
        import hashlib
        import cbor2
        low64 = lambda b: int.from_bytes(hashlib.sha256(b).digest()[24:], "big")
        parent = low64(cbor2.dumps(tp["hashSeed"], canonical=True)) if stored[2] is None else stored[2]
        assert stored[1][0] == low64(cbor2.dumps([parent, tokens[:block], None], canonical=True))
    finally:
        ctx.destroy(0)
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()


def containerfile():
    text = (DEPLOY / "Containerfile").read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2, "a build stage and a runtime stage"

    def apt(stage):
        m = re.search(r"apt-get install -y --no-install-recommends(.*?)&&", stage, re.S)
        return set(m.group(1).replace("\\", " ").split())
    return text, stages, apt(stages[0]), apt(stages[1])


def test_container_file_builds_what_the_repo_needs_and_ships_what_the_binary_links():
    text, stages, build_pkgs, runtime_pkgs = containerfile()
    # The build stage installs every library setup.sh installs to build Tandem
    # (not the tests' gtest, nor python3-dev: the image ships the server, not the Python package).
    setup = (REPO / "scripts" / "setup.sh").read_text()
    setup_pkgs = set(re.search(r"APT_PACKAGES=\((.*?)\)", setup, re.S).group(1).split())
    needed = {p for p in setup_pkgs if p.endswith("-dev") and p not in ("libgtest-dev", "python3-dev")}
    assert needed <= build_pkgs, needed - build_pkgs
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        assert (REPO / src).exists(), f"COPY {src}: no such path"
    # The runtime stage has the package of every library the binary needs.
    readelf = subprocess.run(["readelf", "-d", CLI], capture_output=True, text=True, check=True).stdout
    libs = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf)
    ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    assert libs
    for lib in libs:
        m = re.search(rf"^\s+{re.escape(lib)} \(libc6,x86-64.*?\) => (\S+)$", ldconfig, re.M)
        assert m, f"{lib} not found by ldconfig"
        path = Path(m.group(1)).resolve()
        owner = subprocess.run(["dpkg", "-S", str(path)], capture_output=True, text=True)
        if owner.returncode != 0:  # usr-merged paths are recorded under /lib
            owner = subprocess.run(["dpkg", "-S", str(path).replace("/usr/lib/", "/lib/", 1)],
                                   capture_output=True, text=True)
        pkg = owner.stdout.split(":")[0]
        assert pkg, f"no package owns {path}"
        assert pkg in runtime_pkgs or pkg == "libc6", f"{lib} ({pkg}) is not installed in the runtime stage"
    # The default command is one `tandem serve` accepts.
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M).group(1)
    import json
    args = json.loads(cmd)
    assert args[0] == "serve"
    flags = serve_flags()
    assert all(a in flags for a in args if a.startswith("--"))
    assert re.search(r"^EXPOSE 8000$", text, re.M) and args[args.index("--port") + 1] == "8000"
