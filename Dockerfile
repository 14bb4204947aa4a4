# syntax=docker/dockerfile:1.7
# Flora images. Two targets, same code, same pinned stack (requirements.lock):
#   docker build --target cpu  -t ghcr.io/flora-robotics/flora:cpu  .   # local use, KFP/Airflow CPU steps
#   docker build --target cuda -t ghcr.io/flora-robotics/flora:cuda .   # GPU workers and inference pods
# The lock pins torch==2.13.0+cpu; the cuda target swaps that one line for the CUDA wheel
# (see docs/dependencies.md). Configuration is FLORA_* env at run time, never baked in.

# torch's CUDA wheels bring their own CUDA/cuDNN libraries; the base image only supplies
# the NVIDIA container runtime hooks, so the small "base" flavour is enough.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu22.04
ARG CPU_IMAGE=python:3.11-slim-bookworm

# --------------------------------------------------------------------------- cpu
FROM ${CPU_IMAGE} AS cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 GX_ANALYTICS_ENABLED=false \
    VIRTUAL_ENV=/opt/flora/venv PATH=/opt/flora/venv/bin:$PATH
# git: DVC and MLflow record commits; PyAV bundles FFmpeg, so no codec packages.
RUN apt-get update && apt-get install -y --no-install-recommends git ca-certificates \
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
# DAG files for an Airflow image built FROM this one (AIRFLOW__CORE__DAGS_FOLDER).
COPY dags ./dags
RUN pip install --no-deps . && python -c "import flora, components, kfp, airflow"
RUN useradd --create-home --uid 1000 flora && mkdir -p /data && chown flora /data
USER flora
ENV FLORA_HOME=/home/flora/.flora
ENTRYPOINT ["flora"]
CMD ["--help"]

# --------------------------------------------------------------------------- cuda
FROM ${CUDA_IMAGE} AS cuda
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 GX_ANALYTICS_ENABLED=false DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/flora/venv PATH=/opt/flora/venv/bin:$PATH \
    FLORA_DEVICE=cuda
# Python 3.11 from deadsnakes (jammy itself only has an early 3.11.0 in universe);
# build-essential for the few sdists in the lock (DeepSpeed builds no ops at install).
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
RUN useradd --create-home --uid 1000 flora && mkdir -p /data && chown flora /data
USER flora
ENV FLORA_HOME=/home/flora/.flora
ENTRYPOINT ["flora"]
CMD ["--help"]
