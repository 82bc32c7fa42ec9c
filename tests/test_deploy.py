"""The Kubernetes manifests in deploy/kubernetes/ lint clean and validate: yamllint; the core kinds against
the Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown fields are errors); the KServe
InferenceService against a small vendored schema of its CRD; and the pieces refer to each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from yamllint import config as yl_config
from yamllint import linter

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests promise to work on
ISVC_SCHEMA = ROOT / "tests" / "data" / "k8s" / "inferenceservice-v1beta1.schema.json"
YAMLLINT = yl_config.YamlLintConfig("{extends: default, rules: {line-length: {max: 120}}}")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def validate(doc: dict[str, Any]) -> None:
    """Raise on an invalid resource: core kinds by the Kubernetes schemas, InferenceService by ours."""
    if doc.get("kind") == "InferenceService":
        jsonschema.validate(doc, json.loads(ISVC_SCHEMA.read_text()))
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in documents(p) if d["kind"] == kind]


def container(dep: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def test_there_are_manifests() -> None:
    assert {p.name for p in MANIFESTS} >= {"splitrt-serve.yaml", "kserve-inferenceservice.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_yamllint_is_clean(path: Path) -> None:
    problems = [
        f"{path.name}:{p.line}:{p.column} {p.rule}: {p.desc}" for p in linter.run(path.read_text(), YAMLLINT, str(path))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_every_resource_validates(path: Path) -> None:
    for doc in documents(path):
        validate(doc)


@pytest.mark.parametrize(
    "kind, mutate",
    [
        ("Deployment", lambda d: d["spec"].__setitem__("replica", 2)),  # a typo of replicas
        ("Service", lambda d: d["spec"]["ports"][0].__setitem__("port", "50051")),
        ("InferenceService", lambda d: d["spec"]["predictor"]["model"].__setitem__("storageURI", "pvc://x")),
        ("InferenceService", lambda d: d["spec"]["predictor"]["model"].__setitem__("protocolVersion", "v3")),
    ],
)
def test_the_validators_catch_mistakes(kind: str, mutate: Any) -> None:
    doc = json.loads(json.dumps(by_kind(kind)[0]))
    mutate(doc)
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(doc)


def test_headless_service_selects_the_serve_pods_on_a_named_port() -> None:
    (svc,) = by_kind("Service")
    (dep,) = by_kind("Deployment")
    assert svc["spec"]["clusterIP"] == "None"  # headless: DNS lists every pod for round_robin
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    serve, proxy = container(dep, "serve"), container(dep, "edge-proxy")
    ports = {p["name"]: p["containerPort"] for p in proxy["ports"]}
    assert svc["spec"]["ports"][0]["targetPort"] in ports  # devices reach the proxy, never the server
    args = serve["args"]
    # The server listens on loopback in plaintext, behind the proxy, which terminates TLS.
    assert args[:2] == ["splitrt", "serve"] and "--host=127.0.0.1" in args and "--token-file" in str(args)
    assert "--insecure" not in args and "ports" not in serve
    volumes = {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]}
    pod = dep["spec"]["template"]["spec"]
    mounts = [m["name"] for c in [*pod["containers"], *pod["initContainers"]] for m in c["volumeMounts"]]
    assert set(mounts) <= volumes


def _mib(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 2**20  # plain bytes


def test_serve_budgets_fit_the_pod_and_its_volume() -> None:
    """--max-memory-mb below the container's memory limit (else the kernel kills the pod before the server
    refuses anything) and the upload quota below the models volume, and both parse as `splitrt serve` flags."""
    from splitrt.cli import app as cli

    (dep,) = by_kind("Deployment")
    serve = container(dep, "serve")
    args = dict(a.split("=", 1) for a in serve["args"] if a.startswith("--") and "=" in a)
    limit = _mib(serve["resources"]["limits"]["memory"])
    assert 0 < float(args["--max-memory-mb"]) <= limit * 0.9, (args["--max-memory-mb"], limit)
    assert float(args["--max-request-mb"]) < float(args["--max-memory-mb"])
    (pvc,) = [d for d in by_kind("PersistentVolumeClaim") if d["metadata"]["name"] == "splitrt-models"]
    assert float(args["--max-store-mb"]) < _mib(pvc["spec"]["resources"]["requests"]["storage"])
    parsed = cli.build_parser().parse_args(["serve", *serve["args"][2:]])
    assert parsed.max_memory_mb == float(args["--max-memory-mb"]) and parsed.max_models == int(args["--max-models"])


def test_the_docs_name_the_services_the_manifests_create() -> None:
    readme = (ROOT / "docs" / "operator" / "deployment.md").read_text()
    (svc,) = by_kind("Service")
    name = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    assert f"dns:///{name}:{svc['spec']['ports'][0]['port']}" in readme
    (isvc,) = by_kind("InferenceService")
    assert f"{isvc['metadata']['name']}-predictor.{isvc['metadata']['namespace']}" in readme
    assert "deploy/kubernetes/" in readme


def test_the_serve_arguments_are_real_flags_and_their_limits_hold() -> None:
    """The manifest's and the systemd unit's `splitrt serve` arguments parse with the real parser (a typo
    fails here, not in the pod), and the limits they set pass the server's own checks."""
    from splitrt.cli.app import build_parser
    from splitrt.cli.serve import limits_from

    (dep,) = by_kind("Deployment")
    serve = container(dep, "serve")
    unit = (ROOT / "devices" / "systemd" / "splitrt-cloud.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    unit_args = exec_start.split()[1:]  # after @PREFIX@/venv/bin/splitrt
    for args in (serve["args"][1:], unit_args):
        parsed = build_parser().parse_args(args)
        limits_from(parsed).check()
    # Connections are the edge proxy's (8192 for the pod), not a serve flag any more.
    assert "    maxconn 8192" in (ROOT / "deploy" / "proxy" / "haproxy.cfg").read_text()
    assert "LimitNOFILE=65536" in unit


def test_the_proxy_sidecar_fronts_the_server_with_the_tested_configuration() -> None:
    """The edge proxy runs deploy/proxy/haproxy.cfg (the file tests/test_proxy.py runs, from the ConfigMap the
    header says how to make) with the certificate the init container assembles, forwards to the server's
    loopback port, and the server trusts it for client addresses; readiness asks the server's health."""
    from splitrt.cli.app import build_parser

    (dep,) = by_kind("Deployment")
    pod = dep["spec"]["template"]["spec"]
    serve, proxy = container(dep, "serve"), container(dep, "edge-proxy")
    parsed = build_parser().parse_args(serve["args"][1:])
    env = {e["name"]: e["value"] for e in proxy["env"]}
    assert env["SPLITRT_BACKEND"] == f"{parsed.host}:{parsed.port}" and parsed.trusted_proxy == ["127.0.0.1"]
    config = (ROOT / "deploy" / "proxy" / "haproxy.cfg").read_text()
    assert all(f'"${{{name}}}"' in config for name in env)  # every variable the pod sets is one it reads
    (volume,) = [v for v in pod["volumes"] if v["name"] == "proxy-config"]
    header = (DEPLOY / "splitrt-serve.yaml").read_text()
    assert f"create configmap {volume['configMap']['name']} --from-file=deploy/proxy/haproxy.cfg" in header
    (mount,) = [m for m in proxy["volumeMounts"] if m["name"] == "proxy-config"]
    assert proxy["args"][-1] == f"{mount['mountPath']}/haproxy.cfg"
    assert env["SPLITRT_PROXY_CERT"] in pod["initContainers"][0]["command"][-1]
    assert "healthcheck.py" in " ".join(serve["readinessProbe"]["exec"]["command"])
    assert {e["name"]: e["value"] for e in serve["env"]}["SPLITRT_HEALTH_ADDRESS"] == env["SPLITRT_BACKEND"]
