# A scorer, without CUDA: reward environments run on CPUs. torch's CPU build (constraints/cpu.txt)
# keeps the image free of the multi-GB CUDA wheels. Build from the repository root:
#   docker build -f deploy/images/scorer.Dockerfile -t dockyard-scorer .

# -- build: compilers for the dependencies published as sources only (pycosat)
FROM python:3.12-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/dockyard
ENV PATH=/opt/dockyard/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY constraints ./constraints
COPY dockyard ./dockyard
RUN pip install --no-cache-dir . -c constraints/cpu.txt

# -- runtime
FROM python:3.12-slim AS runtime
# libseccomp2: environments that run code load the sandbox's syscall filter (pyseccomp)
RUN apt-get update && apt-get install -y --no-install-recommends libseccomp2 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 dockyard
COPY --from=build /opt/dockyard /opt/dockyard
COPY configs /app/configs
ENV PATH=/opt/dockyard/bin:$PATH
WORKDIR /app
USER 10001
EXPOSE 9400
ENTRYPOINT ["dockyard", "--log-format", "json"]
CMD ["score", "--config", "configs/quickstart.yaml"]
