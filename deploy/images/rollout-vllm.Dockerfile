# A rollout worker with vLLM's CUDA build, on vLLM's official image (it brings vLLM, the torch it
# pins and the CUDA libraries). Build from the repository root:
#   docker build -f deploy/images/rollout-vllm.Dockerfile -t dockyard-rollout-vllm .
# The config selects the engine: policy.generation.backend=vllm.

# -- build: dockyard as a wheel, so that the runtime stage installs no build tools
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dockyard ./dockyard
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- runtime: vLLM's image; the extra `vllm` is already satisfied by its vllm (and its torch)
FROM vllm/vllm-openai:v0.33.0 AS runtime
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/dockyard-*.whl)[vllm]" && rm -rf /wheels \
    && useradd --create-home --uid 10001 dockyard
COPY configs /app/configs
WORKDIR /app
# vLLM compiles kernels and caches model files under $HOME: the user's own home.
USER 10001
ENV HOME=/home/dockyard
EXPOSE 9400
ENTRYPOINT ["dockyard", "--log-format", "json"]
CMD ["rollout", "--config", "configs/quickstart.yaml", "policy.generation.backend=vllm"]
