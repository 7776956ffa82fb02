# syntax=docker/dockerfile:1
# Gazebo Harmonic (gz-sim 8) with the simbridge system plugin built in, running the cart-pole world
# headless against a trainer at $SIMBRIDGE_ADDRESS (docs/gazebo.md).
#
#   docker build -f docker/gazebo.Dockerfile -t simbridge-gazebo:local .
#   docker run --rm -e SIMBRIDGE_ADDRESS=trainer:50051 --network NET simbridge-gazebo:local
#
# Ubuntu 24.04 is Harmonic's primary platform; gz-sim comes from the Gazebo project's apt
# repository, and gRPC/protobuf for the C++ SDK from Ubuntu's own packages (the same protobuf
# 3.21 that gz-msgs is built with, so one protobuf runtime serves both in the gz-sim process).
FROM ubuntu:24.04

ENV DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && curl -fsSL https://packages.osrfoundation.org/gazebo.gpg \
         -o /usr/share/keyrings/pkgs-osrf-archive-keyring.gpg \
    && . /etc/os-release \
    && echo "deb [arch=$(dpkg --print-architecture) signed-by=/usr/share/keyrings/pkgs-osrf-archive-keyring.gpg]" \
            "http://packages.osrfoundation.org/gazebo/ubuntu-stable ${VERSION_CODENAME} main" \
         > /etc/apt/sources.list.d/gazebo-stable.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
         gz-harmonic libgz-sim8-dev \
         cmake g++ make \
         libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/simbridge/src
COPY proto ./proto
COPY sims/cpp ./sims/cpp
COPY sims/gazebo ./sims/gazebo
# SIMBRIDGE_GZ_REQUIRE_PLUGIN: a missing gz-sim or SDK fails the build instead of skipping the plugin.
RUN cmake -S sims/gazebo -B /tmp/build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/opt/simbridge \
          -DSIMBRIDGE_GZ_REQUIRE_PLUGIN=ON \
    && cmake --build /tmp/build -j"$(nproc)" \
    && ctest --test-dir /tmp/build --output-on-failure \
    && cmake --install /tmp/build \
    && test -f /opt/simbridge/lib/libsimbridge-gz-system.so \
    && rm -rf /tmp/build

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin simbridge
USER 10001:10001
WORKDIR /home/simbridge

# GZ_IP keeps gz-transport's discovery inside the container; the plugin reaches the trainer by gRPC.
ENV GZ_SIM_SYSTEM_PLUGIN_PATH=/opt/simbridge/lib \
    GZ_IP=127.0.0.1 \
    SIMBRIDGE_ADDRESS=127.0.0.1:50051
ENTRYPOINT ["gz", "sim", "-s", "-r", "-v", "3"]
CMD ["/opt/simbridge/src/sims/gazebo/worlds/cartpole.sdf"]
