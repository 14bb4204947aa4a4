# syntax=docker/dockerfile:1.7
# Flora images: one Dockerfile, two runtime targets, same code, same pinned stack
# (requirements.lock). docs/deployment.md has the build, pin and push commands.
#
#   docker build --target cpu  -t $REGISTRY/flora:$TAG-cpu  .   # Airflow / KFP / CI, CPU
#   docker build --target cuda -t $REGISTRY/flora:$TAG-cuda .   # GPU workers
#
# Multi-stage: wheels are built and installed into a virtualenv in a builder stage (which
# has compilers); the runtime stages copy only that virtualenv, so they carry no gcc,
# build-essential or -dev headers. Both runtime stages run as the non-root user `flora`
# (uid 1000). Configuration and secrets are FLORA_* env / mounted files at run time
# (Kubernetes Secrets by reference, see infra/): nothing secret is baked in.
#
# Base images are pinned by digest through these build args. The defaults carry a
# placeholder digest (all zeros) so that an unpinned build fails instead of silently
# taking whatever the tag points at today. Pin them with the digest of the tag you have
# vetted, e.g.
#   docker buildx imagetools inspect nvidia/cuda:12.8.1-runtime-ubuntu22.04 \
#     --format '{{json .Manifest.Digest}}'
# and pass --build-arg CUDA_BASE=nvidia/cuda:12.8.1-runtime-ubuntu22.04@sha256:<digest>
# (CI keeps the vetted digests in one place: docs/deployment.md).
ARG CPU_BASE=python:3.11-slim-bookworm@sha256:0000000000000000000000000000000000000000000000000000000000000000
ARG CUDA_BASE=nvidia/cuda:12.8.1-runtime-ubuntu22.04@sha256:0000000000000000000000000000000000000000000000000000000000000000
ARG CUDA_BUILD_BASE=nvidia/cuda:12.8.1-devel-ubuntu22.04@sha256:0000000000000000000000000000000000000000000000000000000000000000

# ------------------------------------------------------------------ cpu-builder
FROM ${CPU_BASE} AS cpu-builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/flora/venv PATH=/opt/flora/venv/bin:$PATH
# Compilers only here: the few sdists in the lock build their wheels in this stage.
RUN apt-get update && apt-get install -y --no-install-recommends build-essential git \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv $VIRTUAL_ENV && pip install --upgrade pip
WORKDIR /opt/flora/src
COPY requirements.lock ./
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.lock
COPY pyproject.toml README.md ./
COPY flora ./flora
COPY training ./training
COPY components ./components
COPY model_registry ./model_registry
COPY dags ./dags
# Not editable: the package is copied into the venv, which is all the runtime takes.
RUN pip install --no-deps . && python -c "import flora, components, kfp, airflow"

# ------------------------------------------------------------------ cpu (runtime)
FROM ${CPU_BASE} AS cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 GX_ANALYTICS_ENABLED=false \
    VIRTUAL_ENV=/opt/flora/venv PATH=/opt/flora/venv/bin:$PATH \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/flora/dags AIRFLOW__CORE__LOAD_EXAMPLES=False
# git: DVC and MLflow record commits. PyAV bundles FFmpeg, so no codec packages.
RUN apt-get update && apt-get install -y --no-install-recommends git ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --gid 0 flora && mkdir -p /data /home/flora/.flora \
    && chown -R flora:0 /data /home/flora && chmod -R g=u /data /home/flora
COPY --from=cpu-builder /opt/flora/venv /opt/flora/venv
COPY dags /opt/flora/dags
COPY --chmod=0755 tools/docker-entrypoint.sh /usr/local/bin/flora-entrypoint
USER 1000:0
ENV FLORA_HOME=/home/flora/.flora HOME=/home/flora USER=flora LOGNAME=flora
WORKDIR /home/flora
ENTRYPOINT ["tini", "--", "flora-entrypoint"]
CMD ["flora", "--help"]

# ------------------------------------------------------------------ cuda-builder
FROM ${CUDA_BUILD_BASE} AS cuda-builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/flora/venv PATH=/opt/flora/venv/bin:$PATH
# Python 3.11 from deadsnakes (jammy itself only has an early 3.11.0 in universe); the
# runtime stage installs the same interpreter (the venv links to /usr/bin/python3.11).
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev build-essential git ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv $VIRTUAL_ENV && pip install --upgrade pip
WORKDIR /opt/flora/src
COPY requirements.lock ./
# Same pins except torch: the PyPI wheel is the CUDA build (pulls its nvidia-* wheels).
RUN sed 's/^torch==\([0-9.]*\)+cpu$/torch==\1/' requirements.lock > /tmp/requirements.cuda.lock \
    && pip install -r /tmp/requirements.cuda.lock \
    && python -c "import torch; assert torch.version.cuda, 'expected a CUDA build of torch'"
COPY pyproject.toml README.md ./
COPY flora ./flora
COPY training ./training
COPY components ./components
COPY model_registry ./model_registry
COPY dags ./dags
RUN pip install --no-deps . && python -c "import flora, components"

# ------------------------------------------------------------------ cuda (runtime)
FROM ${CUDA_BASE} AS cuda
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 GX_ANALYTICS_ENABLED=false \
    DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/flora/venv PATH=/opt/flora/venv/bin:$PATH \
    AIRFLOW__CORE__DAGS_FOLDER=/opt/flora/dags AIRFLOW__CORE__LOAD_EXAMPLES=False \
    FLORA_DEVICE=cuda
# The interpreter only (no -dev headers, no compilers); the add-apt tooling is removed again.
RUN apt-get update && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv git ca-certificates tini \
    && apt-get purge -y --auto-remove software-properties-common gpg-agent \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --gid 0 flora && mkdir -p /data /home/flora/.flora \
    && chown -R flora:0 /data /home/flora && chmod -R g=u /data /home/flora
COPY --from=cuda-builder /opt/flora/venv /opt/flora/venv
COPY dags /opt/flora/dags
COPY --chmod=0755 tools/docker-entrypoint.sh /usr/local/bin/flora-entrypoint
USER 1000:0
ENV FLORA_HOME=/home/flora/.flora HOME=/home/flora USER=flora LOGNAME=flora
WORKDIR /home/flora
ENTRYPOINT ["tini", "--", "flora-entrypoint"]
CMD ["flora", "--help"]
