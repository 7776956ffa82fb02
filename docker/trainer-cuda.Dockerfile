# syntax=docker/dockerfile:1
# The trainer daemon on an NVIDIA GPU (the host needs the NVIDIA Container Toolkit):
#
#   docker build -f docker/trainer-cuda.Dockerfile -t simbridge-trainer:cuda .
#   docker run --rm --gpus all -p 127.0.0.1:50051:50051 simbridge-trainer:cuda
#
# The config's `device = "auto"` picks cuda when torch sees a GPU.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

# torch's CUDA build for the base image's CUDA release; its wheels bring their own CUDA libraries,
# the base image brings the driver-facing runtime and a matching userland.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

# Ubuntu 24.04's Python is 3.12 and marks its own site-packages as externally managed: use a venv.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /opt/simbridge/src
COPY pyproject.toml README.md ./
COPY simbridge ./simbridge
COPY trainer ./trainer
COPY sims ./sims
RUN pip install "./[trainer]" \
    && python -c "import torch, simbridge.trainer.daemon; assert torch.version.cuda, 'not a CUDA build of torch'"
COPY docker/healthcheck.py /opt/simbridge/healthcheck.py

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin simbridge \
    && mkdir -p /data/runs \
    && chown -R simbridge:simbridge /data
USER 10001:10001
WORKDIR /data

EXPOSE 50051
HEALTHCHECK --interval=5s --timeout=5s --start-period=90s --retries=3 \
    CMD ["python", "/opt/simbridge/healthcheck.py", "127.0.0.1:50051"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["simbridge-trainer"]
CMD ["run", "--address", "0.0.0.0:50051", "--insecure", "--logdir", "/data/runs/cartpole_dqn", "--resume-if-present"]
