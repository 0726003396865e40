# syntax=docker/dockerfile:1
# Wattprint exporter image: docker build -t wattprint:dev .
# Without Docker Hub (or with buildah): scripts/build-image builds this file from a
# Debian base it makes itself. The release workflow publishes it for amd64 and arm64.

# Any Debian-like image with python3 (>= 3.10) and its venv module.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# What the package is built from; .dockerignore lists it.
COPY . ./
# Wattprint and its dependencies go into one venv that the final stage copies whole:
# every dependency comes as a wheel, so no compiler is needed here or there.
# A build behind a TLS-intercepting proxy passes the proxy's CA as the secret
# pip-ca (--secret id=pip-ca,src=FILE); it is mounted for this step only.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -m venv /opt/wattprint \
    && /opt/wattprint/bin/pip install --no-cache-dir --disable-pip-version-check . \
    && /opt/wattprint/bin/pip uninstall --yes --disable-pip-version-check pip setuptools

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="wattprint" \
      org.opencontainers.image.description="Per-node energy and carbon exporter for GPU clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
# The venv links to the base's python3, which is why both stages share the base.
COPY --from=build /opt/wattprint /opt/wattprint
# Nothing is written at run time (pip compiled the bytecode at install), so the
# root file system can be mounted read-only.
ENV PATH=/opt/wattprint/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# nobody:nogroup, numeric so that Kubernetes' runAsNonRoot can verify it. RAPL
# needs root (Linux >= 5.10): run with --user 0 only for that (docs/deploy.md).
# The default --state.file: a node's directory in production (the chart mounts a
# hostPath here, made the exporter's by an init container); in a plain `docker run`
# the container's own layer, so mount a volume to keep counters across containers.
RUN mkdir -p /var/lib/wattprint && chown 65534:65534 /var/lib/wattprint
USER 65534:65534
EXPOSE 9950
ENTRYPOINT ["wattprint"]
