# syntax=docker/dockerfile:1
# TensorRT-LLM worker image: NVIDIA's TensorRT-LLM release image with the gateway as the
# entrypoint supervisor. `gateway serve` starts `trtllm-serve <upstream_model> --host 127.0.0.1
# --port 8000 <args>` from the config's `workers:` entry, routes to it once its /health answers
# 200, restarts it with backoff, and on SIGTERM drains client streams before it stops it.
#   docker build -f deploy/docker/trtllm.Dockerfile -t inference-gateway-trtllm:0.1.0 .
#   docker run --gpus all --ipc=host -p 8080:8080 inference-gateway-trtllm:0.1.0
#       (config: deploy/examples/trtllm.yaml, baked in at /etc/gateway/config.yaml)
# Build context: the repository root.

# Pinned release (hadolint DL3007). The image is NGC PyTorch based: Ubuntu, Python 3.12,
# tensorrt_llm and `trtllm-serve` in the system interpreter (TensorRT-LLM
# docker/Dockerfile.multi, target release).
ARG TRTLLM_VERSION=1.2.1

# The gateway wheel (pure Python, so building it on 3.11 serves the image's 3.12).
FROM python:3.11-slim AS wheel
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas schemas
COPY adapters adapters
COPY gateway gateway
COPY simulator simulator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Its own virtual environment, so that the gateway's dependencies and TensorRT-LLM's cannot
# move each other's versions; `trtllm-serve` stays on PATH from the system interpreter.
# `venv --without-pip` needs no ensurepip; `pip --python` installs into it. The wheel comes
# in through a bind mount, so no layer keeps it.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    python3 -m venv --without-pip /opt/gateway \
    && python3 -m pip --python /opt/gateway/bin/python install --no-cache-dir \
        /wheels/*.whl dumb-init==1.2.5.post1 \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --no-log-init --uid 10001 --gid gateway --create-home \
        --home-dir /home/gateway --shell /usr/sbin/nologin gateway \
    && mkdir -p /etc/gateway /home/gateway/.cache/huggingface \
    && chown -R 10001:10001 /home/gateway
# The example config: model `llama` served by one managed trtllm-serve worker. Kubernetes
# mounts its ConfigMap over /etc/gateway.
COPY deploy/examples/trtllm.yaml /etc/gateway/config.yaml
ENV HOME=/home/gateway \
    HF_HOME=/home/gateway/.cache/huggingface \
    PYTHONUNBUFFERED=1
# Not root, as in the gateway image; a user with a passwd entry, since torch's inductor asks
# getpass.getuser() for its cache directory.
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=900s --retries=3 \
    CMD ["/opt/gateway/bin/python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATEWAY_SERVER__PORT', '8080') + '/health', timeout=2)"]
# NVIDIA's entrypoint first (the base image's own, in every CUDA/NGC image: it runs
# /opt/nvidia/entrypoint.d, prints the license banner, then execs its arguments), then
# dumb-init as PID 1: the gateway's signal proxy and the reaper of orphaned grandchildren.
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", \
            "/opt/gateway/bin/dumb-init", "--", "/opt/gateway/bin/gateway"]
CMD ["serve", "--config", "/etc/gateway/config.yaml"]
