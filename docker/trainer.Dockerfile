# syntax=docker/dockerfile:1
# The trainer daemon on CPU: simbridge-trainer with torch's CPU build.
#
#   docker build -f docker/trainer.Dockerfile -t simbridge-trainer:local .
#   docker run --rm -p 127.0.0.1:50051:50051 simbridge-trainer:local
#
# For a GPU: docker/trainer-cuda.Dockerfile.
FROM python:3.11-slim-bookworm

# The Makefile's pin. torch goes in first, from the CPU index: the trainer extra's loose
# torch>=2.3 is then already met, and pip never pulls the CUDA build and its 3 GB of libraries.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /opt/simbridge/src
COPY pyproject.toml README.md ./
COPY simbridge ./simbridge
COPY trainer ./trainer
COPY sims ./sims
RUN pip install "./[trainer]" \
    && python -c "import torch, simbridge.trainer.daemon; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__"
COPY docker/healthcheck.py /opt/simbridge/healthcheck.py

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin simbridge \
    && mkdir -p /data/runs \
    && chown -R simbridge:simbridge /data
USER 10001:10001
WORKDIR /data

EXPOSE 50051
HEALTHCHECK --interval=5s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/simbridge/healthcheck.py", "127.0.0.1:50051"]
# SIGTERM writes a checkpoint before exit: give `docker stop` time (compose: stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["simbridge-trainer"]
# 0.0.0.0 inside the container: the simulators reach it over the compose network, a private
# one, hence --insecure (plain text beyond loopback); publish it wider only with TLS and a token.
# --resume-if-present: a container started again on the same /data/runs continues the run there.
CMD ["run", "--address", "0.0.0.0:50051", "--insecure", "--logdir", "/data/runs/cartpole_dqn", "--resume-if-present"]
