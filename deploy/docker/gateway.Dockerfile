# syntax=docker/dockerfile:1
# The gateway on its own: ingress topology (deploy/k8s/overlays/ingress) or any host.
#   docker build -f deploy/docker/gateway.Dockerfile -t inference-gateway:0.1.0 .
#   docker run -p 8080:8080 inference-gateway:0.1.0            # embedded demo config
#   docker run -p 8080:8080 -v $PWD/deploy/examples:/etc/gateway:ro inference-gateway:0.1.0 \
#       serve --config /etc/gateway/ingress.yaml
# Build context: the repository root. Both stages are the official image's Python 3.11 on the
# same Debian release (the build stage the full variant, which has a C compiler), so the
# virtual environment made in the first runs unchanged in the second (its python links to
# /usr/local/bin/python3.11 in both, and its compiled modules to the same glibc).

FROM python:3.11-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY build_support build_support
COPY schemas schemas
COPY adapters adapters
COPY gateway gateway
COPY simulator simulator
# --without-pip + `pip --python`: the environment gets the gateway and its dependencies,
# not pip itself; the `otel` extra, so that the image can export traces (OTEL_* variables).
# GATEWAY_COMPILE=1: the hot modules compiled with mypyc, or the build fails (setup.py;
# build_support/compile_choice.py; bench/RESULTS.md §21).
# dumb-init (pinned, from PyPI) becomes PID 1: it forwards SIGTERM to the
# gateway and reaps orphaned grandchildren of managed workers.
RUN python -m venv --without-pip /opt/gateway \
    && GATEWAY_COMPILE=1 pip --python /opt/gateway/bin/python install --no-cache-dir "./[otel]" \
        dumb-init==1.2.5.post1

FROM python:3.11-slim-bookworm
# A fixed numeric user, so that Kubernetes' runAsNonRoot can check it without a passwd lookup.
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --no-log-init --uid 10001 --gid gateway --home-dir /nonexistent \
        --shell /usr/sbin/nologin gateway
COPY --from=build /opt/gateway /opt/gateway
ENV PATH=/opt/gateway/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8080
# No curl in the slim image: python's urllib. urlopen raises on 503, so the check fails while
# the default model has no healthy upstream (GET /health, SPEC.md). The port follows
# GATEWAY_SERVER__PORT, the way to move the port in a container.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('GATEWAY_SERVER__PORT', '8080') + '/health', timeout=2)"]
ENTRYPOINT ["dumb-init", "--", "gateway"]
CMD ["serve"]
