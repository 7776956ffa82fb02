# syntax=docker/dockerfile:1
# A reference simulator (simbridge-sim): the Python SDK and gymnasium, no torch.
#
#   docker build -f docker/sim.Dockerfile -t simbridge-sim:local .
#   docker run --rm --add-host=host.docker.internal:host-gateway \
#     -e SIMBRIDGE_ADDRESS=host.docker.internal:50051 simbridge-sim:local --slots 8
# (--add-host: Linux's Docker has no host.docker.internal of its own; and the trainer on the host
# must listen beyond its loopback, which takes TLS and a token, or --insecure: docs/security.md)
#
# Also the base for a Python simulator of your own: FROM simbridge-sim:local, COPY it, set ENTRYPOINT.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SIMBRIDGE_ADDRESS=127.0.0.1:50051

WORKDIR /opt/simbridge/src
COPY pyproject.toml README.md ./
COPY simbridge ./simbridge
COPY trainer ./trainer
COPY sims ./sims
# No extras. The build fails if anything pulled torch in: the simulator side must stay light.
RUN pip install . \
    && python -c "import importlib.util as u, sys; sys.exit('torch is installed in the simulator image' if u.find_spec('torch') else 0)" \
    && python -c "import simbridge.client, simbridge.sims.gym_sim"
COPY --chmod=755 docker/sim-entrypoint.sh /usr/local/bin/simbridge-sim-entrypoint

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin simbridge
USER 10001:10001
WORKDIR /home/simbridge

ENTRYPOINT ["simbridge-sim-entrypoint"]
CMD ["--env", "CartPole-v1"]
