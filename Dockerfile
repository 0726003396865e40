# syntax=docker/dockerfile:1
# Wattprint exporter image: docker build -t wattprint:dev .
# The final stage holds Python, the wheels and nothing to build with.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Wheels for the package and every dependency, so the final stage installs
# offline from /wheels and never needs a compiler.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="wattprint" \
      org.opencontainers.image.description="Per-node energy and carbon exporter for GPU clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Bind-mounted, not copied: the wheels never become a layer of this image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels wattprint
# nobody:nogroup, numeric so that Kubernetes' runAsNonRoot can verify it. RAPL
# needs root (Linux >= 5.10): run with --user 0 only for that (docs/deploy.md).
USER 65534:65534
EXPOSE 9950
ENTRYPOINT ["wattprint"]
