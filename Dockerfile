# syntax=docker/dockerfile:1
# Multi-stage: build a wheel with its dependencies in a builder, run as non-root in a slim
# image. The gateway needs no torch: the `train` and `gpu` extras stay out of this image.
FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends build-essential && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md LICENSE ./
COPY pricing ./pricing
COPY router ./router
COPY gateway ./gateway
COPY training ./training
RUN python -m venv /opt/xrouter && /opt/xrouter/bin/pip install --upgrade pip && /opt/xrouter/bin/pip install .

FROM python:3.11-slim AS runtime
ENV PATH=/opt/xrouter/bin:$PATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True
# The ledger's journal directory, owned by the user: a named volume mounted there (compose)
# takes the directory's owner, so the gateway can write its journal to it.
RUN useradd --create-home --uid 10001 xrouter \
    && install -d -o xrouter -g xrouter /var/lib/xrouter/spill
COPY --from=builder /opt/xrouter /opt/xrouter
USER xrouter
WORKDIR /home/xrouter
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz').status == 200 else 1)"
# With no --config this is the embedded demo; mount a config and pass --config for real use.
ENTRYPOINT ["xrouter", "serve", "--host", "0.0.0.0", "--port", "8000"]
