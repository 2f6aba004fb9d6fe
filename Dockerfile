# syntax=docker/dockerfile:1
#
# The two dsx images, built from one context:
#
#   control  ghcr.io/dsx-dev/dsx      every workflow step (plan, resolve, gate, report, bundle, drift, and the
#                                     checks that launch group Jobs): Python and dsx, no CUDA, no torch.
#   gpu      ghcr.io/dsx-dev/dsx-gpu  the rank pods of group tests: CUDA PyTorch with NCCL and torchrun,
#                                     nccl-tests, libfabric and aws-ofi-nccl for EFA fabrics, and dsx.
#
#   docker buildx build --target control -t ghcr.io/dsx-dev/dsx:0.1.0 .
#   docker buildx build --target gpu -t ghcr.io/dsx-dev/dsx-gpu:0.1.0 .
#
# Both end as the non-root user 65532:65532, the uid the workflow pods' securityContext runs as.
# tests/test_image.py ties this file to what the compiled templates and the rank pods run.

# Control base: the Python that dsx runs on in both images (the PyTorch base below ships 3.12 too).
ARG PYTHON_IMAGE=python:3.12.12-slim-trixie
# GPU base: NGC PyTorch 25.12 (CUDA 13.1, PyTorch 2.10, Python 3.12, Ubuntu 24.04). Torch is built against
# the system NCCL, whose headers and libraries nccl-tests builds against too, so both measure one NCCL.
# CUDA 13 needs an R580 driver or newer (the recipes' GPU Operator default is 580.82.07).
ARG PYTORCH_IMAGE=nvcr.io/nvidia/pytorch:25.12-py3
# Network plugin for NCCL: efa (libfabric + aws-ofi-nccl, inert until NCCL_NET_PLUGIN names it) or none.
ARG FABRIC=efa

# ---------------------------------------------------------------------------------------------------------
# The dsx wheel (packages steps, workflows, recipes), built once and installed into both images.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY steps/ steps/
COPY workflows/ workflows/
COPY recipes/ recipes/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---------------------------------------------------------------------------------------------------------
# Control image: dsx and its dependencies in a virtual environment, on the slim Python base.
FROM ${PYTHON_IMAGE} AS control-venv
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    python -m venv /opt/dsx \
    && /opt/dsx/bin/python -m pip install --no-cache-dir /wheels/dsx-*.whl

FROM ${PYTHON_IMAGE} AS control
LABEL org.opencontainers.image.title="dsx" \
      org.opencontainers.image.description="dsx workflow steps: Python and dsx, no CUDA" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=control-venv /opt/dsx/ /opt/dsx/
ENV PATH=/opt/dsx/bin:${PATH} \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# What every step runs (python -m hera.workflows.runner -e steps...), what the sentinel DaemonSet runs
# (dsx sentinel agent, with NVML's bindings and the Prometheus client), and no torch.
RUN python -c "import hera.workflows.runner, steps, workflows, recipes, pynvml, prometheus_client" \
    && python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)" \
    && test -x /opt/dsx/bin/dsx \
    && dsx version \
    && dsx sentinel agent --help > /dev/null
USER 65532:65532
WORKDIR /tmp
CMD ["dsx", "--help"]

# ---------------------------------------------------------------------------------------------------------
# GPU base: the PyTorch image plus what the builds below need (git, autotools, hwloc for aws-ofi-nccl, the
# rdma-core headers for libfabric's EFA provider unless the base has them). The base is a full CUDA
# development image already; sharing this layer keeps the builders and the final image on the same
# libraries (hwloc, libibverbs, libefa). Packages follow the Ubuntu release the pinned base is built on.
FROM ${PYTORCH_IMAGE} AS gpu-base
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends autoconf automake git libhwloc-dev libtool make pkg-config \
    && if [ ! -e /usr/include/infiniband/efadv.h ]; then \
         apt-get install -y --no-install-recommends libibverbs-dev; \
       fi \
    && rm -rf /var/lib/apt/lists/*

# nccl-tests from source at a pinned release, checked against its commit. MPI=0: each *_perf runs one
# process driving the node's GPUs (-g N); rank pods use torchrun, not mpirun, across nodes.
# The GPU architectures are the recipe catalogue's accelerators: A100 (sm_80), H100/H200 (sm_90),
# B200/GB200 (sm_100), plus PTX for newer ones.
FROM gpu-base AS nccl-tests
ARG NCCL_TESTS_VERSION=v2.19.6
ARG NCCL_TESTS_COMMIT=a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
ARG CUDA_GENCODE="-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_100,code=sm_100 -gencode=arch=compute_100,code=compute_100"
WORKDIR /build/nccl-tests
RUN git clone --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git . \
    && test "$(git rev-parse HEAD)" = "${NCCL_TESTS_COMMIT}" \
    && make -j"$(nproc)" MPI=0 CUDA_HOME=/usr/local/cuda NVCC_GENCODE="${CUDA_GENCODE}" BUILDDIR=/build/out \
    && install -d /opt/nccl-tests/bin \
    && install -m 0755 /build/out/*_perf /opt/nccl-tests/bin/ \
    && test -x /opt/nccl-tests/bin/all_reduce_perf

# libfabric with the EFA provider, and aws-ofi-nccl (NCCL's net plugin over libfabric), both at pinned
# releases checked against their commits, under one prefix. The plugin is built without the default
# libnccl-net.so name, so NCCL loads it only when NCCL_NET_PLUGIN=/opt/dsx-efa/lib/libnccl-net-ofi.so (an
# EFA recipe sets it, with FI_PROVIDER=efa); on other fabrics NCCL keeps its own InfiniBand or socket
# transport. Its run path finds this libfabric before any other the base may carry.
FROM gpu-base AS fabric-efa
ARG LIBFABRIC_VERSION=v2.6.0
ARG LIBFABRIC_COMMIT=5de2d6a2df83595bcc38531cb91bf59495559495
ARG AWS_OFI_NCCL_VERSION=v1.21.1
ARG AWS_OFI_NCCL_COMMIT=2475c4c736907e68ebeadb3848f31231ee4a44d0
WORKDIR /build/libfabric
RUN git clone --depth 1 --branch "${LIBFABRIC_VERSION}" https://github.com/ofiwg/libfabric.git . \
    && test "$(git rev-parse HEAD)" = "${LIBFABRIC_COMMIT}" \
    && ./autogen.sh \
    && ./configure --prefix=/opt/dsx-efa --disable-static --enable-efa=yes \
         --with-cuda=/usr/local/cuda --enable-cuda-dlopen \
    && make -j"$(nproc)" \
    && make install \
    && test -x /opt/dsx-efa/bin/fi_info
WORKDIR /build/aws-ofi-nccl
RUN git clone --depth 1 --branch "${AWS_OFI_NCCL_VERSION}" https://github.com/aws/aws-ofi-nccl.git . \
    && test "$(git rev-parse HEAD)" = "${AWS_OFI_NCCL_COMMIT}" \
    && ./autogen.sh \
    && ./configure --prefix=/opt/dsx-efa --with-libfabric=/opt/dsx-efa --with-cuda=/usr/local/cuda \
         --enable-platform-aws --disable-tests --disable-nccl-net-library \
         LDFLAGS="-Wl,-rpath,/opt/dsx-efa/lib" \
    && make -j"$(nproc)" \
    && make install \
    && test -f /opt/dsx-efa/lib/libnccl-net-ofi.so

FROM gpu-base AS fabric-none
RUN install -d /opt/dsx-efa

# A stage of this file chosen by FABRIC, not an image to pull.
# hadolint ignore=DL3006
FROM fabric-${FABRIC} AS fabric

# ---------------------------------------------------------------------------------------------------------
# GPU image: the PyTorch base, nccl-tests on PATH, the fabric plugin, and dsx in the base's Python (torchrun
# starts its ranks with that interpreter, so dsx must be importable there). The base's pip constraints keep
# its torch stack as it was tested.
FROM gpu-base AS gpu
LABEL org.opencontainers.image.title="dsx-gpu" \
      org.opencontainers.image.description="dsx rank pods: CUDA PyTorch with NCCL, torchrun, nccl-tests, aws-ofi-nccl" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=nccl-tests /opt/nccl-tests/bin/ /opt/nccl-tests/bin/
COPY --from=fabric /opt/dsx-efa/ /opt/dsx-efa/
# PIP_BREAK_SYSTEM_PACKAGES: the base's Python is Ubuntu's, which may be marked externally managed; dsx
# goes into it all the same, as torchrun's ranks need it there.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install --no-cache-dir /wheels/dsx-*.whl
ENV PATH=/opt/nccl-tests/bin:${PATH} \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# What a rank pod runs, found and linked: python -m steps.readiness..., torchrun, all_reduce_perf, NCCL in
# torch, and every library the nccl-tests programs and the fabric plugin load.
RUN for tool in python torchrun all_reduce_perf; do command -v "$tool" || exit 1; done \
    && python -c "import torch.distributed as d, steps.readiness.ranks.sweep, steps.readiness.ranks.smoke; assert d.is_nccl_available()" \
    && for binary in /opt/nccl-tests/bin/*_perf /opt/dsx-efa/lib/*.so; do \
         [ -e "$binary" ] || continue; \
         ldd "$binary" > /tmp/ldd.txt && ! grep -F "not found" /tmp/ldd.txt || exit 1; \
       done \
    && rm -f /tmp/ldd.txt
USER 65532:65532
WORKDIR /tmp
