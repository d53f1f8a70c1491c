# The trainer (with the dispatcher) on NVIDIA GPUs: PyPI's CUDA torch in a virtual environment on
# NVIDIA's CUDA runtime image. Build from the repository root:
#   docker build -f deploy/images/trainer.Dockerfile -t dockyard-trainer .
# Kubernetes runs it under torchrun (deploy/k8s/base/trainer.yaml); alone it is one rank.

# -- build: compilers for the dependencies published as sources only (pycosat, via reasoning-gym)
FROM nvidia/cuda:12.8.1-devel-ubuntu24.04 AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
        build-essential && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/dockyard
ENV PATH=/opt/dockyard/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dockyard ./dockyard
# No constraints file: pyproject's ranges let pip take PyPI's CUDA torch (docs/deployment.md,
# "Supported versions"). loggers: the trainer is the role that reports to trackers.
RUN pip install --no-cache-dir ".[loggers]"

# -- runtime: the CUDA runtime libraries and the environment, no compilers
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 dockyard
COPY --from=build /opt/dockyard /opt/dockyard
COPY configs /app/configs
ENV PATH=/opt/dockyard/bin:$PATH
WORKDIR /app
# Checkpoints and logs go to the run directory: mount a volume at /runs.
USER 10001
EXPOSE 9400
ENTRYPOINT ["dockyard", "--log-format", "json"]
CMD ["trainer", "--config", "configs/quickstart.yaml", "--run-dir", "/runs/quickstart"]
