"""deploy/: the nginx configuration in front of a real gateway, and checks of the rest.

nginx runs ``deploy/nginx/nginx.conf`` as :mod:`tests.deploy.nginx` prepares it, in front
of the gateway started here.

The static checks hold the other files to the code: every metric an alert or a dashboard
panel uses is in a real gateway's ``/metrics``; every environment variable that compose,
Kubernetes or a Dockerfile sets is one the code reads; probes, ports and paths agree.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from engine.backends.base import backend_names
from gateway.app import WEBSOCKET_ROUTES
from gateway.voices.reference_audio import MAX_UPLOAD_BYTES
from tests.deploy.nginx import NGINX, WAIT_S, Nginx, running_nginx
from tests.integration.harness import GatewayProcess, NativeClient, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# Environment variables that are not the project's but that images may set.
STANDARD_ENV = {"PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "DEBIAN_FRONTEND"}
STANDARD_ENV |= {"PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK"}


# -- helpers -------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def yaml_documents(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def k8s_objects() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            objects += yaml_documents(path)
    return objects


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def gateway_container() -> dict[str, Any]:
    spec = k8s_object("Deployment", "ivr-gateway")["spec"]["template"]["spec"]
    containers: list[dict[str, Any]] = spec["containers"]
    return next(c for c in containers if c["name"] == "gateway")


def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(DEPLOY / "compose.yaml")
    return data


def compose_gateways() -> dict[str, dict[str, Any]]:
    """Compose services that run the gateway image (the YAML merge key resolved)."""
    services: dict[str, dict[str, Any]] = compose()["services"]
    return {
        name: svc
        for name, svc in services.items()
        if "GATEWAY_JWT_SECRET" in (svc.get("environment") or {})
    }


def code_env_names() -> set[str]:
    """Environment variable names the code reads: string literals in gateway/ and engine/."""
    names: set[str] = set()
    pattern = re.compile(r"""["']((?:GATEWAY|ENGINE|COSYVOICE2)_[A-Z0-9_]+|LOG_LEVEL)["']""")
    for package in ("gateway", "engine"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(pattern.findall(path.read_text(encoding="utf-8")))
    return names


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerfile_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction, args in dockerfile_instructions(path):
        if instruction == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_OURS = re.compile(r"^(?:gateway_|cosy2_|engine_)")


def metric_names_in(expr: str) -> set[str]:
    """The project's metric names (gateway_*, cosy2_*, engine_*) a PromQL expression uses;
    quoted strings (label values, Grafana variables) are left out."""
    return {n for n in _IDENTIFIER.findall(_QUOTED.sub(" ", expr)) if _OURS.match(n)}


def alert_rules() -> list[dict[str, Any]]:
    groups = load_yaml(DEPLOY / "prometheus" / "alerts.yml")["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (DEPLOY / "grafana" / "dashboards" / "ivr-gateway.json").read_text(encoding="utf-8")
    )
    return data


def dashboard_exprs() -> list[str]:
    board = dashboard()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for var in board["templating"]["list"]:
        exprs.append(var["definition"])
    return exprs


def exposition_names(text: str) -> set[str]:
    """Every series name a Prometheus text exposition can produce, including those of
    labelled families that have no child yet (their HELP and TYPE lines are there)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("_count", "_sum", "_created"),
        "gauge": ("",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


# -- the real gateway and nginx ------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """A real gateway and espeak engine (no VAD: nothing here is duplex)."""
    log = tmp_path_factory.mktemp("deploy-gateway") / "gateway.log"
    gw = GatewayProcess(log, ENGINE_VAD="0")
    gw.start(timeout=60)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def nginx(gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    if not NGINX.exists():
        pytest.skip(f"{NGINX} is not installed (Debian package nginx)")
    # Listed first, nothing listens there: nginx's first request tries it, fails over to
    # the gateway, and logs the failure -- with the request line -- in the request's
    # context: the path that must not let a token reach a log.
    dead = f"127.0.0.1:{free_port()}"
    with running_nginx(
        tmp_path_factory.mktemp("nginx"), [dead, f"127.0.0.1:{gateway.port}"], dead=dead
    ) as proxy:
        yield proxy


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
        yield session


async def speak_through(url: str, token: str) -> tuple[dict[str, Any], list[bytes]]:
    """One native session with the token in ``?access_token=``: start, speak, close."""
    client = await NativeClient.connect(url, token, query_token=True)
    try:
        ready = await client.start("en-us", "mulaw_8000", pacing="burst")
        await client.send(type="speak", text="Thank you for calling.", utterance_id="u1")
        await client.wait_event("utterance_done", timeout=WAIT_S, utterance_id="u1")
        await client.send(type="close")
        await client.wait_closed(WAIT_S)
        return ready, [frame for _, frame in client.got.frames]
    finally:
        await client.aclose()


async def wait_access_log(nginx: Nginx, path: str) -> list[dict[str, Any]]:
    """Access entries for ``path`` (a WebSocket's is written when the connection ends)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        entries = [e for e in nginx.access_entries() if e["path"] == path]
        if entries or time.monotonic() > deadline:
            return entries
        await asyncio.sleep(0.05)


# -- nginx in front of the real gateway ----------------------------------------------


def test_nginx_t_accepts_the_configuration(nginx: Nginx) -> None:
    result = subprocess.run(
        [str(NGINX), "-t", "-p", str(nginx.prefix), "-c", str(nginx.conf)],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


async def test_websocket_session_through_nginx(nginx: Nginx, gateway: GatewayProcess) -> None:
    ready, frames = await speak_through(nginx.ws_url, gateway.token())
    assert ready["format"] == "mulaw_8000"
    assert ready["sample_rate"] == 8000 and ready["frame_ms"] == 20
    assert len(frames) >= 10, "expected at least 200 ms of audio"
    assert {len(f) for f in frames} == {160}, "mu-law 8 kHz: 160 bytes per 20 ms frame"
    assert len(set(b"".join(frames))) > 16, "speech, not a constant"


async def test_other_websocket_protocols_are_upgraded(
    nginx: Nginx, gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    """Twilio, Asterisk, jambonz and FreeSWITCH paths reach the gateway as WebSockets (a
    missing token is refused by the gateway after the upgrade, or with its own HTTP error --
    not by nginx)."""
    for path in ("/v1/twilio", "/v1/asterisk", "/v1/jambonz", "/v1/freeswitch"):
        assert path in WEBSOCKET_ROUTES
        token = gateway.token()
        async with http.ws_connect(f"{nginx.base}{path}?access_token={token}") as ws:
            await ws.close()


async def test_voices_api_through_nginx(
    nginx: Nginx, gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": f"Bearer {gateway.token()}"}
    async with http.get(f"{nginx.base}/v1/voices", headers=headers) as resp:
        assert resp.status == 200
        body = await resp.json()
    ids = {v["id"] for v in body["voices"]}
    assert {"en-us", "zh", "yue"} <= ids


async def test_openai_speech_streams_through_nginx(
    nginx: Nginx, gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": f"Bearer {gateway.token()}"}
    body = {"model": "tts-1", "voice": "en-us", "input": "Hello.", "response_format": "pcm"}
    async with http.post(f"{nginx.base}/v1/audio/speech", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        audio = await resp.read()
    assert len(audio) > 24_000 * 2 * 0.2  # over 200 ms of 24 kHz PCM


async def test_voice_upload_of_the_gateways_full_size_passes_nginx(
    nginx: Nginx, gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    """10 MiB of audio (the gateway's limit) gets through nginx to the gateway, which
    answers (400: not audio) -- not nginx's 413."""
    form = aiohttp.FormData()
    form.add_field("name", "too-big-for-default-nginx")
    form.add_field("audio", b"\x01" * MAX_UPLOAD_BYTES, filename="x.wav")
    token = gateway.token(scopes=["tts:stream", "voices:write"])
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(f"{nginx.base}/v1/voices", data=form, headers=headers) as resp:
        body = await resp.json(content_type=None)
    assert resp.status == 400, body
    assert body["error"]["code"] == "invalid_audio"


async def test_metrics_and_readyz_are_not_public(
    nginx: Nginx, gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{gateway.base}/metrics") as resp:
        assert resp.status == 200  # the gateway serves it: Prometheus scrapes it directly
    for path in ("/metrics", "/metrics?x=1", "//metrics", "/%6detrics", "/readyz", "/nope"):
        url = URL(f"{nginx.base}{path}", encoded=True)  # sent as written, %6d included
        async with http.get(url) as resp:
            assert resp.status in (403, 404), f"{path}: {resp.status}"
            assert b"gateway_" not in await resp.read()
    async with http.get(f"{nginx.base}/healthz") as resp:
        assert resp.status == 200
    for path in ("/", "/static/app.js"):  # the demo page and its assets
        async with http.get(f"{nginx.base}{path}") as resp:
            assert resp.status == 200, path


async def test_tokens_never_reach_a_log(
    nginx: Nginx, gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    token = gateway.token(subject="log-check")
    await speak_through(nginx.ws_url, token)
    async with http.get(f"{nginx.base}/v1/voices?access_token={token}") as resp:
        assert resp.status == 200
    async with http.get(f"{nginx.base}/metrics?access_token={token}") as resp:
        assert resp.status == 404

    stream = await wait_access_log(nginx, "/v1/stream")
    assert stream, f"no access-log entry for /v1/stream: {nginx.logs()}"
    assert any(e["status"] == 101 for e in stream)
    assert await wait_access_log(nginx, "/v1/voices")
    # nginx tried the dead upstream first and failed over: the error path ran, and its
    # message (which carries the request line) went nowhere.
    upstreams = [e["upstream"] for e in nginx.access_entries()]
    assert any(nginx.dead_upstream in u and "," in u for u in upstreams), upstreams

    logs = nginx.logs()
    assert token not in logs
    assert "access_token" not in logs
    assert token.split(".")[2] not in logs  # not even the signature
    assert token not in gateway.log_text()


# -- static checks ---------------------------------------------------------------------


def test_every_yaml_and_json_file_parses() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert len(files) >= 10
    for path in files:
        assert yaml_documents(path), f"{path} is empty"
    for path in DEPLOY.rglob("*.json"):
        json.loads(path.read_text(encoding="utf-8"))


def test_alerts_and_dashboard_use_only_metrics_the_gateway_exports(
    gateway: GatewayProcess,
) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{gateway.base}/metrics", timeout=WAIT_S) as resp:
        exported = exposition_names(resp.read().decode())

    used_by_alerts: set[str] = set()
    for rule in alert_rules():
        names = metric_names_in(rule["expr"])
        if rule["alert"] != "GatewayDown":  # up{} is Prometheus' own
            assert names, f"alert {rule['alert']} uses none of the gateway's metrics"
        used_by_alerts |= names
    used_by_dashboard: set[str] = set()
    for expr in dashboard_exprs():
        names = metric_names_in(expr)
        assert names, f"dashboard expression without a gateway metric: {expr}"
        used_by_dashboard |= names

    assert used_by_alerts - exported == set()
    assert used_by_dashboard - exported == set()
    for wanted in (
        "gateway_underruns_total",
        "gateway_first_audio_seconds_bucket",
        "gateway_rejections_total",
        "cosy2_tts_errors_total",
        "cosy2_queue_length",
        "engine_memory_used_bytes",
        "gateway_lease_store_errors_total",
        "engine_speech_cache_errors_total",
        "engine_speech_cache_hits_total",
    ):
        assert wanted in used_by_alerts, f"no alert on {wanted}"
    for wanted in (
        "gateway_sessions_active",
        "gateway_first_audio_seconds_bucket",
        "gateway_underruns_total",
        "gateway_rejections_total",
        "cosy2_tts_errors_total",
        "cosy2_queue_length",
        "engine_memory_used_bytes",
        "cosy2_cache_hit_ratio",
        "gateway_barge_ins_total",
        "gateway_speech_cache_first_audio_seconds_bucket",
        "engine_speech_cache_hits_total",
        "engine_speech_cache_bytes",
        "engine_speech_cache_entries",
        "engine_speech_cache_evictions_total",
        "engine_speech_cache_errors_total",
    ):
        assert wanted in used_by_dashboard, f"no dashboard panel on {wanted}"


def test_every_environment_variable_set_is_read_by_the_code() -> None:
    known = code_env_names() | STANDARD_ENV
    assert {"GATEWAY_JWT_SECRET", "GATEWAY_REDIS_URL", "ENGINE_SLOTS", "LOG_LEVEL"} <= known

    set_where: dict[str, set[str]] = {}
    for name, svc in compose_gateways().items():
        set_where[f"compose {name}"] = set(svc["environment"])
    set_where["k8s ConfigMap"] = set(k8s_object("ConfigMap", "ivr-gateway-config")["data"])
    secret = yaml_documents(DEPLOY / "k8s" / "secret.example.yaml")[0]
    set_where["k8s Secret example"] = set(secret["stringData"])
    set_where["k8s Deployment env"] = {e["name"] for e in gateway_container().get("env", [])}
    for dockerfile in sorted((DEPLOY / "docker").glob("Dockerfile*")):
        if not dockerfile.name.endswith(".dockerignore"):
            set_where[dockerfile.name] = set(dockerfile_env(dockerfile))

    assert len(compose_gateways()) >= 2
    for where, names in set_where.items():
        assert names, f"{where} sets nothing"
        assert names - known == set(), f"{where} sets variables the code never reads"


def test_engine_backends_are_registered_ones() -> None:
    registered = set(backend_names())
    values = [svc["environment"]["ENGINE_BACKEND"] for svc in compose_gateways().values()]
    values.append(k8s_object("ConfigMap", "ivr-gateway-config")["data"]["ENGINE_BACKEND"])
    values.append(dockerfile_env(DEPLOY / "docker" / "Dockerfile")["ENGINE_BACKEND"])
    assert set(values) <= registered
    gpu = DEPLOY / "docker" / "Dockerfile.cosyvoice2"
    assert dockerfile_env(gpu)["ENGINE_BACKEND"] == "cosyvoice2"
    not_yet = "NOT USABLE YET" in gpu.read_text(encoding="utf-8")
    assert not_yet == ("cosyvoice2" not in registered), (
        "Dockerfile.cosyvoice2's 'NOT USABLE YET' note must match whether the engine "
        "registers a cosyvoice2 backend"
    )


async def test_k8s_probes_ports_and_shutdown(
    gateway: GatewayProcess, http: aiohttp.ClientSession
) -> None:
    container = gateway_container()
    config = k8s_object("ConfigMap", "ivr-gateway-config")["data"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    relay = int(config["GATEWAY_RELAY_PORT"])
    workers = int(config["GATEWAY_WORKERS"])
    assert ports == {
        "http": int(config["GATEWAY_PORT"]),
        **{f"relay-{i}": relay + i for i in range(workers)},  # one relay port per worker
    }
    env = {e["name"]: e for e in container["env"]}
    assert env["GATEWAY_RELAY_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert config["GATEWAY_HOST"] == "0.0.0.0"

    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("readinessProbe", "livenessProbe", "startupProbe")
    }
    assert probes["readinessProbe"]["path"] == "/readyz"
    assert probes["livenessProbe"]["path"] == "/healthz"
    for kind, probe in probes.items():
        assert probe["port"] in ("http", ports["http"]), kind
        async with http.get(f"{gateway.base}{probe['path']}") as resp:
            assert resp.status == 200, f"{kind} {probe['path']}: {resp.status}"

    pod = k8s_object("Deployment", "ivr-gateway")["spec"]["template"]["spec"]
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(sleep[1]) + 60
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "/tmp" in mounts  # the engine's control socket, on a read-only root
    assert "secretKeyRef" in str(container["env"])

    service = k8s_object("Service", "ivr-gateway")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    selector = service["spec"]["selector"]
    labels = k8s_object("Deployment", "ivr-gateway")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    pdb = k8s_object("PodDisruptionBudget", "ivr-gateway")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = k8s_object("HorizontalPodAutoscaler", "ivr-gateway")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ivr-gateway"
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]


def test_k8s_ingress_routes_only_public_paths() -> None:
    ingress = k8s_object("Ingress", "ivr-gateway")
    paths = {p["path"] for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    assert set(WEBSOCKET_ROUTES) <= paths
    assert "/metrics" not in paths and "/readyz" not in paths
    for rule in ingress["spec"]["rules"]:
        for p in rule["http"]["paths"]:
            assert not (p["path"] == "/" and p["pathType"] == "Prefix"), "/ would expose /metrics"
    notes = ingress["metadata"]["annotations"]
    assert int(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600
    assert notes["nginx.ingress.kubernetes.io/enable-access-log"] == "false"
    kustomization = load_yaml(DEPLOY / "k8s" / "kustomization.yaml")
    assert "secret.example.yaml" not in kustomization["resources"]
    for resource in kustomization["resources"]:
        assert (DEPLOY / "k8s" / resource).is_file()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds() -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "k8s")],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc}
    assert {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler"} <= kinds


def test_compose_wiring() -> None:
    spec = compose()
    services = spec["services"]
    gateways = compose_gateways()
    for name, svc in gateways.items():
        env = svc["environment"]
        assert env["GATEWAY_JWT_SECRET"].startswith("${GATEWAY_JWT_SECRET"), name
        assert env["GATEWAY_REDIS_URL"].startswith("redis://redis:"), name
        assert env["GATEWAY_HOST"] == "0.0.0.0"
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert (DEPLOY / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        assert svc["shm_size"]
        relay, workers = int(env["GATEWAY_RELAY_PORT"]), int(env["GATEWAY_WORKERS"])
        assert {int(p) for p in svc["expose"]} == {
            int(env["GATEWAY_PORT"]),
            *(relay + i for i in range(workers)),  # other instances relay to each worker
        }, name
    ports = {int(svc["environment"]["GATEWAY_PORT"]) for svc in gateways.values()}
    assert len(ports) == 1
    port = ports.pop()

    upstreams = re.findall(
        r"^server\s+(\S+)", (DEPLOY / "nginx" / "upstream.conf").read_text(), flags=re.M
    )
    assert sorted(upstreams) == sorted(f"{name}:{port}" for name in gateways)
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    job = next(j for j in scrape if j["job_name"] == "ivr-gateway")
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert sorted(targets) == sorted(upstreams)
    assert job.get("metrics_path", "/metrics") == "/metrics"

    for svc in services.values():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"compose mounts missing {source}"
    nginx_mounts = [v.split(":")[1] for v in services["nginx"]["volumes"]]
    assert "/etc/nginx/nginx.conf" in nginx_mounts
    assert "/etc/nginx/upstream.conf" in nginx_mounts  # include upstream.conf is relative


def test_engine_memory_budget_is_the_same_everywhere() -> None:
    rule = next(r for r in alert_rules() if r["alert"] == "EngineMemoryHigh")
    assert "engine_memory_budget_bytes" in rule["expr"]  # the engine's own figure
    budget = compose_gateways()["gateway-1"]["environment"]["ENGINE_MEMORY_BUDGET_MB"]
    for name, svc in compose_gateways().items():
        assert svc["environment"]["ENGINE_MEMORY_BUDGET_MB"] == budget, name
    config = k8s_object("ConfigMap", "ivr-gateway-config")["data"]
    assert config["ENGINE_MEMORY_BUDGET_MB"] == budget
    limit = gateway_container()["resources"]["limits"]["memory"]
    assert limit.endswith("Gi") and int(budget) < int(limit[:-2]) * 1024


def test_grafana_provisioning_matches_the_dashboard() -> None:
    prov = DEPLOY / "grafana" / "provisioning"
    datasources = load_yaml(prov / "datasources" / "prometheus.yml")["datasources"]
    uids = {d["uid"] for d in datasources}
    board = dashboard()
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] in uids, panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    provider = load_yaml(prov / "dashboards" / "ivr-gateway.yml")["providers"][0]
    mounts = dict(v.split(":")[:2] for v in compose()["services"]["grafana"]["volumes"])
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]


def test_dockerfiles() -> None:
    ignore = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for name in ("Dockerfile", "Dockerfile.cosyvoice2"):
        path = DEPLOY / "docker" / name
        assert (DEPLOY / "docker" / f"{name}.dockerignore").is_file()
        steps = dockerfile_instructions(path)
        text = path.read_text(encoding="utf-8")
        for instruction, args in steps:
            if instruction == "COPY" and not args.startswith("--from"):
                for source in shlex.split(args)[:-1]:
                    assert (ROOT / source).exists(), f"{name}: COPY {source}: not in the repo"
                    assert source in allowed, f"{name}: COPY {source}: excluded by .dockerignore"
        assert "constraints.txt" in text and "-c constraints.txt" in text
        assert "libopus0" in text
        env = dockerfile_env(path)
        assert env["GATEWAY_HOST"] == "0.0.0.0"
        assert ("EXPOSE", env["GATEWAY_PORT"]) in steps
        users = [args for instruction, args in steps if instruction == "USER"]
        assert users and not users[-1].startswith(("root", "0")), name
        assert steps[-1] == ("CMD", '["python", "-m", "gateway", "serve"]')
        health = [args for instruction, args in steps if instruction == "HEALTHCHECK"]
        assert len(health) == 1 and "/healthz" in health[0]
    cpu = (DEPLOY / "docker" / "Dockerfile").read_text(encoding="utf-8")
    assert "python:3.11-slim-bookworm" in cpu
    assert "download.pytorch.org/whl/cpu" in cpu
    assert "nvidia/cuda:" in (DEPLOY / "docker" / "Dockerfile.cosyvoice2").read_text()


# -- promtool, where installed (Debian package prometheus) ----------------------------

promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def run_promtool(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=WAIT_S, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@promtool
def test_promtool_checks_config_and_rules(tmp_path: Path) -> None:
    prom = DEPLOY / "prometheus"
    shutil.copy(prom / "alerts.yml", tmp_path / "alerts.yml")
    config = (prom / "prometheus.yml").read_text(encoding="utf-8")
    assert "/etc/prometheus/alerts.yml" in config  # where compose mounts it
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/alerts.yml", "alerts.yml"), encoding="utf-8"
    )
    run_promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    run_promtool("test", "rules", str(prom / "alerts_test.yml"), cwd=prom)


@promtool
def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    """Each panel's query as a recording rule, Grafana's variables filled in."""
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        if expr.startswith("label_values("):
            continue
        promql = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
        rules.append({"record": f"dashboard:expr_{i}", "expr": promql})
    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8"
    )
    run_promtool("check", "rules", "rules.yml", cwd=tmp_path)
