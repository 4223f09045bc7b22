"""Invariants of the Kubernetes manifests, Dockerfiles and compose file (fast, offline).

The overlays are rendered with deploy/render_kustomize.py, the fallback renderer that
deploy/validate.sh uses where kustomize is not installed; where kubectl is installed the two
renderings are also compared, object for object.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from service.config import Settings
from service.redis_url import parse_redis_url

REPO = Path(__file__).resolve().parents[2]
OVERLAYS = ("cpu", "gpu", "s3", "redis-sentinel", "redis-cluster")
# The store on a shared volume; s3 keeps it in a bucket.
VOLUME_OVERLAYS = ("cpu", "gpu", "redis-sentinel", "redis-cluster")
# The cache on a Redis installed on its own (Sentinel or Cluster): no in-cluster Redis of ours.
HA_REDIS_OVERLAYS = {"redis-sentinel": "sentinel", "redis-cluster": "cluster"}
Obj = dict[str, Any]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


render_kustomize = _load("render_kustomize")
check_compose = _load("check_compose")


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, render_kustomize.render(REPO / "k8s" / "overlays" / request.param)


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_spec(obj: Obj) -> Obj:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def workloads(objs: list[Obj]) -> Iterator[Obj]:
    return (o for o in objs if o["kind"] in {"Deployment", "StatefulSet", "Job", "CronJob"})


def all_containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def mount(container: Obj, path: str) -> Obj:
    found = [m for m in container.get("volumeMounts", []) if m["mountPath"] == path]
    assert found, f"{container['name']}: nothing mounted at {path}"
    return found[0]


def volume(spec: Obj, name: str) -> Obj:
    return next(v for v in spec["volumes"] if v["name"] == name)


def config(objs: list[Obj]) -> dict[str, str]:
    return one(objs, "ConfigMap", "clip-config")["data"]


def test_every_object_is_namespaced_and_labelled(overlay: tuple[str, list[Obj]]) -> None:
    _, objs = overlay
    for obj in objs:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "clip-service"
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "clip", obj["metadata"]["name"]


def test_service_probes_and_graceful_termination(overlay: tuple[str, list[Obj]]) -> None:
    _, objs = overlay
    deploy = one(objs, "Deployment", "clip-service")
    spec = pod_spec(deploy)
    (api,) = spec["containers"]
    assert api["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    startup = api["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 180, "model load needs minutes"
    sleep = int(api["lifecycle"]["preStop"]["exec"]["command"][-1])
    graceful = float(config(objs)["CLIP_GRACEFUL_SHUTDOWN_S"])
    assert spec["terminationGracePeriodSeconds"] > sleep + graceful
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert "replicas" not in deploy["spec"], "the HPA owns the replica count"
    term = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_service_mounts_store_read_only_and_keys_from_secret(overlay: tuple[str, list[Obj]]) -> None:
    name, objs = overlay
    if name not in VOLUME_OVERLAYS:
        pytest.skip("no store volume: see test_s3_overlay_shares_the_store_through_the_bucket")
    spec = pod_spec(one(objs, "Deployment", "clip-service"))
    (api,) = spec["containers"]
    models = mount(api, "/models")
    assert models["readOnly"] is True
    assert volume(spec, models["name"])["persistentVolumeClaim"] == {"claimName": "clip-models", "readOnly": True}
    assert "emptyDir" in volume(spec, mount(api, "/tmp")["name"])
    keys_file = next(e["value"] for e in api["env"] if e["name"] == "CLIP_API_KEYS_FILE")
    keys_mount = mount(api, str(Path(keys_file).parent))
    assert keys_mount["readOnly"] is True
    secret = volume(spec, keys_mount["name"])["secret"]
    assert [i["path"] for i in secret["items"]] == [Path(keys_file).name]
    assert api["envFrom"] == [{"configMapRef": {"name": "clip-config"}}]


def test_jobs_mount_store_read_write(overlay: tuple[str, list[Obj]]) -> None:
    name, objs = overlay
    if name not in VOLUME_OVERLAYS:
        pytest.skip("no store volume: see test_s3_overlay_shares_the_store_through_the_bucket")
    train = one(objs, "Job", "clip-train")
    assert train["spec"]["suspend"] is True, "applying the manifests must not start a training run"
    spec = pod_spec(train)
    trainer, tuner = spec["initContainers"]
    (promoter,) = spec["containers"]
    assert trainer["args"][:3] == ["build-default", "--store", "/models"]
    assert promoter["command"] == ["model-store"] and "promote" in promoter["args"]
    # The new version is tuned before the promote (pods load it at the alias move), with the pods'
    # thread count, and a tune that cannot decide does not hold the promote.
    assert tuner["args"][:4] == ["tune", "default@staging", "--store", "/models"]
    assert (
        tuner["args"][tuner["args"].index("--threads") + 1] == "$(CLIP_TORCH_THREADS)" and "--no-fail" in tuner["args"]
    )
    assert tuner["resources"]["limits"]["cpu"] == tuner["resources"]["requests"]["cpu"]
    for container in (trainer, tuner, promoter):
        assert not mount(container, "/models").get("readOnly", False)
    assert "readOnly" not in volume(spec, "models")["persistentVolumeClaim"]
    cron = one(objs, "CronJob", "clip-train-nightly")
    assert cron["spec"]["suspend"] is True
    assert not mount(pod_spec(cron)["containers"][0], "/models").get("readOnly", False)
    seed = pod_spec(one(objs, "Job", "clip-model-seed"))["containers"][0]
    assert not mount(seed, "/store").get("readOnly", False)


def test_restricted_security_context_everywhere(overlay: tuple[str, list[Obj]]) -> None:
    _, objs = overlay
    for obj in workloads(objs):
        spec = pod_spec(obj)
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in all_containers(spec):
            sc = c["securityContext"]
            where = f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert sc["runAsUser"] >= 10000, where
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), where
            mount(c, "/tmp" if c["name"] != "redis" else "/data")


def test_gpu_overlay_requests_gpus_and_cpu_does_not(overlay: tuple[str, list[Obj]]) -> None:
    name, objs = overlay
    gpu_workloads = [one(objs, "Deployment", "clip-service"), one(objs, "Job", "clip-train"),
                     one(objs, "CronJob", "clip-train-nightly")]  # fmt: skip
    for obj in gpu_workloads:
        spec = pod_spec(obj)
        limits = [c["resources"]["limits"].get("nvidia.com/gpu") for c in all_containers(spec)]
        if name == "gpu":
            assert 1 in limits, obj["metadata"]["name"]
            assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
            assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
        else:
            assert set(limits) == {None} and "nodeSelector" not in spec
    assert config(objs)["CLIP_DEVICE"] == ("cuda" if name == "gpu" else "cpu")
    trainer, tuner = pod_spec(one(objs, "Job", "clip-train"))["initContainers"]
    for step in (trainer, tuner):  # the tune times where the pods of that overlay serve
        assert step["args"][step["args"].index("--device") + 1] == ("cuda" if name == "gpu" else "cpu")
    for obj in workloads(objs):
        for c in all_containers(pod_spec(obj)):
            if c["name"] != "redis":
                assert c["image"].startswith("registry.example.com/clip/"), c["image"]
                assert c["image"].endswith(f"-{'cuda' if name == 'gpu' else 'cpu'}"), c["image"]


def test_supporting_objects(overlay: tuple[str, list[Obj]]) -> None:
    _, objs = overlay
    svc = one(objs, "Service", "clip-service")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    hpa = one(objs, "HorizontalPodAutoscaler", "clip-service")
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert one(objs, "PodDisruptionBudget", "clip-service")["spec"]["minAvailable"] == 1
    if overlay[0] in VOLUME_OVERLAYS:
        pvc = one(objs, "PersistentVolumeClaim", "clip-models")
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    else:
        assert [o for o in objs if o["kind"] == "PersistentVolumeClaim"] == []
    cfg = config(objs)
    assert cfg["CLIP_MODEL"] == "default@production"
    if overlay[0] in HA_REDIS_OVERLAYS:
        return  # see test_ha_redis_overlays_point_the_cache_at_sentinel_or_cluster
    assert cfg["CLIP_REDIS_URL"] == "redis://redis:6379/0"
    assert one(objs, "Service", "redis")["spec"]["ports"][0]["port"] == 6379
    redis_policy = one(objs, "NetworkPolicy", "redis-from-clip-service")
    sources = redis_policy["spec"]["ingress"][0]["from"]
    assert sources == [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": "clip-service", "app.kubernetes.io/component": "api"}
            }
        }
    ]
    assert one(objs, "NetworkPolicy", "default-deny-ingress")["spec"]["podSelector"] == {}


def test_configmap_keys_are_real_settings(overlay: tuple[str, list[Obj]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt CLIP_* key would be silently ignored by the service: catch it here."""
    name, objs = overlay
    data = config(objs)
    for key in data:
        assert key.startswith("CLIP_"), key
        top, _, nested = key.removeprefix("CLIP_").lower().partition("__")
        assert top in Settings.model_fields, key
        if nested:
            nested_model = Settings.model_fields[top].annotation
            assert nested in nested_model.model_fields, key  # type: ignore[union-attr]
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    store = "/models" if name in VOLUME_OVERLAYS else "s3://clip-models/store"
    assert settings.model == "default@production" and settings.store == store


@pytest.mark.parametrize(("name", "mode"), sorted(HA_REDIS_OVERLAYS.items()))
def test_ha_redis_overlays_point_the_cache_at_sentinel_or_cluster(name: str, mode: str) -> None:
    objs = render_kustomize.render(REPO / "k8s" / "overlays" / name)
    url = config(objs)["CLIP_REDIS_URL"]
    target = parse_redis_url(url)
    assert target.mode == mode and target.password is None, "a password belongs in the clip-redis Secret"
    assert all(host.endswith(".svc.cluster.local") for host, _ in target.hosts)
    # The base's single Redis and its policy are gone; everything else is the cpu overlay's.
    dropped = {"redis", "redis-from-clip-service"}
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    cpu = render_kustomize.render(REPO / "k8s" / "overlays" / "cpu")
    assert names == {(o["kind"], o["metadata"]["name"]) for o in cpu if o["metadata"]["name"] not in dropped}
    (api,) = pod_spec(one(objs, "Deployment", "clip-service"))["containers"]
    env = {e["name"]: e for e in api["env"]}
    # The Secret's URL (with a password) wins when it exists; without it the ConfigMap's applies.
    assert env["CLIP_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "clip-redis", "key": "url", "optional": True}
    assert api["envFrom"] == [{"configMapRef": {"name": "clip-config"}}]
    assert "CLIP_API_KEYS_FILE" in env


def test_s3_overlay_shares_the_store_through_the_bucket() -> None:
    objs = render_kustomize.render(REPO / "k8s" / "overlays" / "s3")
    cfg = config(objs)
    location = cfg["CLIP_STORE"]
    assert location.startswith("s3://") and cfg["CLIP_STORE_CACHE_DIR"] == "/var/cache/clip-store"
    aws = one(objs, "ConfigMap", "clip-s3")["data"]
    assert set(aws) <= {"AWS_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SHARED_CREDENTIALS_FILE"}
    assert not any("SECRET" in key or "ACCESS_KEY" in key for key in aws), "credentials belong in the Secret"
    credentials_file = Path(aws["AWS_SHARED_CREDENTIALS_FILE"])

    api = pod_spec(one(objs, "Deployment", "clip-service"))
    train = pod_spec(one(objs, "Job", "clip-train"))
    cron = pod_spec(one(objs, "CronJob", "clip-train-nightly"))
    seed = pod_spec(one(objs, "Job", "clip-model-seed"))
    (server,) = api["containers"]
    assert "--store" not in server["args"], "the service reads CLIP_STORE from the ConfigMap"
    assert {"configMapRef": {"name": "clip-config"}} in server["envFrom"]
    (trainer, tuner), (promoter,) = train["initContainers"], train["containers"]
    (nightly,), (seeder,) = cron["containers"], seed["containers"]
    store_args = {
        "train": trainer["args"][trainer["args"].index("--store") + 1],
        "tune": tuner["args"][tuner["args"].index("--store") + 1],
        "promote": promoter["args"][promoter["args"].index("--store") + 1],
        "nightly": nightly["args"][nightly["args"].index("--store") + 1],
        "seed": seeder["args"][seeder["args"].index("--target") + 1],
    }
    assert set(store_args.values()) == {"$(CLIP_STORE)"}, store_args
    for spec, containers in ((api, [server]), (train, [trainer, tuner, promoter]), (cron, [nightly]), (seed, [seeder])):
        assert not any("persistentVolumeClaim" in v for v in spec["volumes"]), "no shared volume"
        for container in containers:
            where = container["name"]
            env = {e["name"]: e for e in container.get("env", [])}
            from_config = [e["configMapRef"]["name"] for e in container.get("envFrom", [])]
            if container is not server:  # $(CLIP_STORE) in args needs the variable in env
                assert env["CLIP_STORE"]["valueFrom"]["configMapKeyRef"] == {"name": "clip-config", "key": "CLIP_STORE"}
                assert "CLIP_STORE_CACHE_DIR" in env, where
            assert "clip-s3" in from_config, where
            assert not any(k.startswith("AWS_") and "valueFrom" in e for k, e in env.items()), where
            cache = mount(container, "/var/cache/clip-store")
            assert not cache.get("readOnly", False) and "emptyDir" in volume(spec, cache["name"]), where
            creds = mount(container, str(credentials_file.parent))
            assert creds["readOnly"] is True, where
            secret = volume(spec, creds["name"])["secret"]
            assert secret["optional"] is True and secret["items"] == [
                {"key": "credentials", "path": credentials_file.name}
            ]


def test_fallback_renderer_matches_kubectl(overlay: tuple[str, list[Obj]]) -> None:
    name, objs = overlay
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "k8s" / "overlays" / name)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    reference = [d for d in yaml.safe_load_all(out) if d]
    assert render_kustomize.differences(objs, reference) == []


def test_service_monitor_scrapes_every_api_pod_and_is_optional() -> None:
    """k8s/monitoring selects the API Service and its `http` port, which leads to the container port
    the service answers /metrics on; no overlay includes it (it needs the Prometheus Operator's CRDs)."""
    objs = render_kustomize.render(REPO / "k8s" / "monitoring")
    assert [(o["kind"], o["metadata"]["namespace"]) for o in objs] == [("ServiceMonitor", "clip")]
    monitor = objs[0]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/part-of"] == "clip-service"
    for name in OVERLAYS:
        rendered = render_kustomize.render(REPO / "k8s" / "overlays" / name)
        assert not [o for o in rendered if o["kind"] in ("ServiceMonitor", "PodMonitor")], name
        svc = one(rendered, "Service", "clip-service")
        assert monitor["metadata"]["namespace"] == svc["metadata"]["namespace"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(), name
        [endpoint] = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        [port] = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
        container = pod_spec(one(rendered, "Deployment", "clip-service"))["containers"][0]
        assert [c["containerPort"] for c in container["ports"] if c["name"] == port["targetPort"]] == [8000]
    if shutil.which("kubectl") is not None:
        out = subprocess.run(
            ["kubectl", "kustomize", str(REPO / "k8s" / "monitoring")],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        assert render_kustomize.differences(objs, [d for d in yaml.safe_load_all(out) if d]) == []


def test_hpa_names_an_exported_queue_metric() -> None:
    """The custom metric the HPA's comment tells operators to enable is one the service exports."""
    from service.runtime import ServiceMetrics

    hpa = (REPO / "k8s" / "base" / "hpa.yaml").read_text()
    named = re.findall(r"name: (clip_\w+)", hpa)
    assert named, "hpa.yaml names no clip_ metric"
    exported = {family.name for family in ServiceMetrics().registry.collect()}
    assert set(named) <= exported, set(named) - exported


def test_renderer_rejects_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nconfigMapGenerator: []\n")
    with pytest.raises(render_kustomize.KustomizeError, match="unsupported"):
        render_kustomize.render(tmp_path)


def test_images_match_the_manifests() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd is not None
    spec = pod_spec(one(render_kustomize.render(REPO / "k8s" / "overlays" / "cpu"), "Deployment", "clip-service"))
    assert yaml.safe_load(cmd.group(1)) == spec["containers"][0]["args"]
    assert "USER 10001:10001" in dockerfile and "EXPOSE 8000" in dockerfile
    assert "/healthz" in dockerfile.split("HEALTHCHECK", 1)[1].split("\n\n", 1)[0]
    final = "\n".join(line for line in dockerfile.rsplit("FROM ", 1)[1].splitlines() if not line.startswith("#"))
    assert not re.search(r"\b(gcc|build-essential|curl|wget)\b", final), "no build tools in the final stage"
    seed = pod_spec(one(render_kustomize.render(REPO / "k8s" / "overlays" / "cpu"), "Job", "clip-model-seed"))
    script = seed["containers"][0]["command"][-1]
    assert f"COPY deploy/seed_store.py {script}" in dockerfile
    assert "!deploy/seed_store.py" in (REPO / ".dockerignore").read_text()
    train = (REPO / "deploy" / "Dockerfile.train").read_text()
    assert 'ENTRYPOINT ["clip-train"]' in train and "USER 10001:10001" in train


def test_compose_invariants() -> None:
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    assert check_compose.problems(compose) == []
    assert check_compose.GRACEFUL_SHUTDOWN_S == Settings.model_fields["graceful_shutdown_s"].default
