# syntax=docker/dockerfile:1
# vLLM worker image: vLLM's official image with the gateway as the entrypoint supervisor.
# `gateway serve` starts `vllm serve <upstream_model> --host 127.0.0.1 --port 8000 <args>` from
# the config's `workers:` entry, routes to it once its /health answers 200, restarts it with
# backoff, and on SIGTERM drains client streams before it stops vLLM (sidecar topology,
# deploy/k8s/overlays/sidecar).
#   docker build -f deploy/docker/vllm.Dockerfile -t inference-gateway-vllm:0.1.0 .
#   docker run --gpus all -p 8080:8080 inference-gateway-vllm:0.1.0    # deploy/examples/vllm.yaml
# Build context: the repository root.

# Pinned: vLLM's image tags are its releases (hadolint DL3007: never `latest`). Python 3.12,
# vLLM in the system interpreter, ENTRYPOINT ["vllm", "serve"] (vllm docker/Dockerfile,
# target vllm-openai).
ARG VLLM_VERSION=v0.11.0

# The gateway wheel (pure Python, so building it on 3.11 serves vLLM's 3.12).
FROM python:3.11-slim AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY adapters adapters
COPY gateway gateway
COPY simulator simulator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM vllm/vllm-openai:${VLLM_VERSION}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The gateway gets its own virtual environment: its dependencies (pydantic, starlette,
# uvicorn, ...) must not move the versions vLLM was released with, and vLLM's must not move
# the gateway's. `vllm` stays on PATH from the system interpreter; the supervisor runs it.
# The wheel comes in through a bind mount, so no layer keeps it.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    python3 -m venv --without-pip /opt/gateway \
    && python3 -m pip --python /opt/gateway/bin/python install --no-cache-dir \
        /wheels/*.whl dumb-init==1.2.5.post1 \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --no-log-init --uid 10001 --gid gateway --create-home \
        --home-dir /home/gateway --shell /usr/sbin/nologin gateway \
    && mkdir -p /etc/gateway /home/gateway/.cache/huggingface \
    && chown -R 10001:10001 /home/gateway
# The example config: model `qwen` served by one managed vLLM worker. Kubernetes mounts its
# ConfigMap over /etc/gateway.
COPY deploy/examples/vllm.yaml /etc/gateway/config.yaml
# vLLM, Triton and torch.compile write caches under $HOME; Hugging Face downloads under
# HF_HOME (mount a volume there to keep weights across restarts).
ENV HOME=/home/gateway \
    HF_HOME=/home/gateway/.cache/huggingface \
    PYTHONUNBUFFERED=1
# A user with a passwd entry: torch's inductor asks getpass.getuser() for its cache directory.
USER 10001:10001
EXPOSE 8080
# Healthy once the managed vLLM answers /health (the gateway's /health is 200 only then);
# loading weights takes minutes, hence the long start period.
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s --retries=3 \
    CMD ["/opt/gateway/bin/python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATEWAY_SERVER__PORT', '8080') + '/health', timeout=2)"]
# dumb-init as PID 1: it forwards SIGTERM to the gateway (not to vLLM, which runs in its own
# session: the gateway stops it after draining) and reaps orphaned grandchildren.
ENTRYPOINT ["/opt/gateway/bin/dumb-init", "--", "/opt/gateway/bin/gateway"]
CMD ["serve", "--config", "/etc/gateway/config.yaml"]
