# The trainer's image: `python -m trainer` under tini, as the non-root user 1000:1000.
# Build it with `make image` (scripts/image/build-image.sh), or `docker build .` for the defaults.
#   BASE_IMAGE  any Debian image with python3 = 3.11 and python3 -m venv (the official slim image
#               by default; scripts/image/make-base-image.sh makes one where no registry is reachable).
#               Pin it by digest, name@sha256:...: a tag can be moved to other contents. make image passes
#               the settings' BASE_IMAGE_DIGEST and refuses a registry base without one (docs/security.md);
#               a plain `docker build .` builds FROM the tag, unpinned.
#   TF_FLAVOUR  cpu (default, tensorflow-cpu), gpu (tensorflow[and-cuda]) or tf: an extra of pyproject.toml
#   VERSION, REVISION, SOURCE  the OCI labels
ARG BASE_IMAGE=docker.io/library/python:3.11.14-slim-bookworm

# Dependencies only: this stage is rebuilt when the lock or the flavour changes, never for a change to trainer/.
FROM ${BASE_IMAGE} AS deps
ARG TF_FLAVOUR=cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --quiet pip==25.3
WORKDIR /build
# The flavour's hashed lock (make lock): every package pinned with the sha256 of its files, so a file that changed
# on the index fails the build instead of entering the image.
COPY scripts/image/locks/ locks/
# tensorflow/include holds C++ headers for compiling custom ops (about 290 MB); nothing here compiles.
RUN /opt/venv/bin/pip install --quiet --require-hashes --no-deps -r "locks/$TF_FLAVOUR.txt" \
 && rm -rf /opt/venv/lib/python3*/site-packages/tensorflow/include

# The trainer as a wheel, built here so the runtime stage needs no build tools.
FROM deps AS wheel
COPY pyproject.toml ./
COPY trainer/ trainer/
RUN /opt/venv/bin/pip wheel --quiet --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE} AS runtime
# tini runs as PID 1: PID 1 ignores default-action signals, so without it SIGTERM would not reach the trainer.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log \
 && groupadd --gid 1000 trainer \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin trainer
COPY --from=deps /opt/venv /opt/venv
# COPY, not RUN --mount: buildah 1.28 reuses a cached RUN step although the mounted wheel changed.
COPY --from=wheel /wheels/ /tmp/wheels/
RUN PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/venv/bin/pip install --quiet --no-deps --no-index /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
# The project's own modules (your task, your datasets: modules/), importable as modules.<name> from any working
# directory; after the trainer, so a change to them rebuilds only this layer.
COPY modules/ /opt/project/modules/
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/project \
    PYTHONUNBUFFERED=1
# Numeric, so Kubernetes' runAsNonRoot can verify it; a volume is writable through fsGroup 1000.
USER 1000:1000
WORKDIR /home/trainer
# -s: tini also reaps zombies where it is not PID 1 (a shared process namespace, buildah run).
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "python", "-m", "trainer"]

# Last, so a new revision only rewrites the image's metadata.
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.description="TensorFlow MultiWorkerMirroredStrategy trainer for Kubeflow TFJob" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
