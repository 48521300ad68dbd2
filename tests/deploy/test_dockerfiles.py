"""The Dockerfiles pass hadolint (every rule, down to style), pin their base images, copy only
what their .dockerignore lets through, agree with the manifests (user, port, entrypoint), and
their HEALTHCHECK command tells a healthy gateway from an unhealthy one."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway import config
from tests.deploy import DEPLOY, ROOT, tool
from tests.integration import procs

DOCKER = DEPLOY / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
IDS = [p.name for p in DOCKERFILES]
# The worker kind each worker image supervises (its baked-in example config's `workers:`).
WORKER_IMAGES = {"vllm.Dockerfile": "vllm", "trtllm.Dockerfile": "trtllm"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") \
            else line.strip()
        if not line.rstrip().endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(a, str) for a in value), args
    return value


def last(path: Path, word: str) -> str:
    found = [rest for w, rest in instructions(path) if w == word]
    assert found, f"{path.name}: no {word}"
    return found[-1]


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_hadolint_passes(path: Path) -> None:
    done = subprocess.run(
        [tool("hadolint"), "--config", str(DOCKER / "hadolint.yaml"), "--format", "json",
         "--no-color", str(path)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stdout + done.stderr


def test_hadolint_is_real(tmp_path: Path) -> None:
    """Our settings fail an unpinned base image, an untrusted registry and an unpinned pip."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM ghcr.io/example/python:latest\nRUN pip install --no-cache-dir orjson\n")
    done = subprocess.run(
        [tool("hadolint"), "--config", str(DOCKER / "hadolint.yaml"), "--format", "json",
         str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert {f["code"] for f in json.loads(done.stdout)} >= {"DL3007", "DL3026", "DL3013"}


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_base_images_are_pinned(path: Path) -> None:
    args = {}
    stages: set[str] = set()
    for word, rest in instructions(path):
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name] = default
        if word == "FROM":
            image, *alias = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            if image not in stages:
                name, _, tag = image.rpartition(":")
                assert name and tag and tag != "latest" and "/" not in tag, image
            if alias:
                stages.add(alias[-1])


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_copies_pass_the_dockerignore(path: Path) -> None:
    """Each COPY from the build context exists and is let through by the Dockerfile's own
    ignore file (BuildKit reads <Dockerfile>.dockerignore beside it)."""
    ignore = (DOCKER / f"{path.name}.dockerignore").read_text().splitlines()
    allowed = [line[1:] for line in ignore if line.startswith("!")]
    assert "*" in ignore
    for word, rest in instructions(path):
        if word != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = shlex.split(rest)
        for src in sources:
            assert (ROOT / src).exists(), src
            assert any(Path(src).match(a) or src == a for a in allowed), src


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_images_agree_with_manifests(path: Path) -> None:
    """USER is the runAsUser of the manifests; EXPOSE the gateway's port; the entrypoint is
    `dumb-init -- gateway`, so that the manifests' args are the gateway's arguments."""
    base = yaml.safe_load((DEPLOY / "k8s" / "base" / "deployment.yaml").read_text())
    pod_ctx = base["spec"]["template"]["spec"]["securityContext"]
    assert last(path, "USER") == f"{pod_ctx['runAsUser']}:{pod_ctx['runAsGroup']}"
    assert last(path, "EXPOSE") == str(config.ServerConfig().port)
    entry = exec_form(last(path, "ENTRYPOINT"))
    assert [Path(a).name for a in entry[-3:]] == ["dumb-init", "--", "gateway"]
    assert exec_form(last(path, "CMD"))[0] == "serve"


@pytest.mark.parametrize("name", sorted(WORKER_IMAGES))
def test_worker_images_bake_a_config_of_their_kind(name: str) -> None:
    copies = [rest.split() for word, rest in instructions(DOCKER / name) if word == "COPY"]
    baked = [src for src, dest in (c for c in copies if len(c) == 2)
             if dest == "/etc/gateway/config.yaml"]
    assert len(baked) == 1
    assert exec_form(last(DOCKER / name, "CMD")) == ["serve", "--config",
                                                     "/etc/gateway/config.yaml"]
    cfg = config.load_config(ROOT / baked[0], {})
    assert [w.kind for w in cfg.workers] == [WORKER_IMAGES[name]]


def healthcheck(path: Path) -> list[str]:
    """The HEALTHCHECK's command, run by this interpreter instead of the image's."""
    options, _, cmd = last(path, "HEALTHCHECK").partition("CMD ")
    assert "--start-period=" in options
    argv = exec_form(cmd)
    assert Path(argv[0]).name == "python"
    return [sys.executable, *argv[1:]]


def start(tmp: Path, config_text: str) -> tuple[procs.Proc, int]:
    """A gateway whose port comes from GATEWAY_SERVER__PORT, as in a container."""
    port = procs.free_port()
    cfg = tmp / f"gateway-{port}.yaml"
    cfg.write_text(config_text)
    env = {"GATEWAY_SERVER__PORT": str(port), "GATEWAY_SERVER__HOST": "127.0.0.1"}
    proc = procs.Proc([sys.executable, "-m", "gateway", "serve", "--config", str(cfg)],
                      tmp / f"gateway-{port}.log", env)
    proc.wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=30)
    return proc, port


@pytest.mark.integration
def test_healthcheck_tells_healthy_from_unhealthy(tmp_path: Path) -> None:
    commands = {tuple(healthcheck(p)[1:]): healthcheck(p) for p in DOCKERFILES}
    unserved = "default_model: x\nmodels: [{name: x}]\n"  # no upstream: /health is 503
    for text, expected in (((DEPLOY / "examples" / "local.yaml").read_text(), 0),
                           (unserved, 1)):
        proc, port = start(tmp_path, text)
        try:
            if expected == 0:  # the simulator is healthy within the gateway's startup
                procs.Proc.wait_http(proc, f"http://127.0.0.1:{port}/health")
            for argv in commands.values():
                done = subprocess.run(argv, env={"GATEWAY_SERVER__PORT": str(port)},
                                      capture_output=True, text=True, timeout=10)
                assert done.returncode == expected, done.stderr
        finally:
            proc.stop()


def test_gateway_image_can_export_traces() -> None:
    """The gateway image installs the `otel` extra, so OTEL_* variables alone turn tracing on
    in a pod (deploy/README.md, Observability); `./[otel]` is a path, which DL3013 allows."""
    text = (DOCKER / "gateway.Dockerfile").read_text()
    install = next(line for line in text.splitlines() if " install " in line)
    assert '"./[otel]"' in install
