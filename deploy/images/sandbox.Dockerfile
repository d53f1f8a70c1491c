# The sandbox service (`dockyard sandbox serve`: apply a patch, run the tests), without CUDA.
# Each job runs under bubblewrap in namespaces of its own with a seccomp filter
# (docs/operations.md, "Isolation of one run"). Build from the repository root:
#   docker build -f deploy/images/sandbox.Dockerfile -t dockyard-sandbox .
# Non-root: bubblewrap then needs unprivileged user namespaces from the host kernel and the
# container runtime (Kubernetes: deploy/k8s/base/sandbox.yaml says what it asks for).

# -- build
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

# -- runtime: bubblewrap and libseccomp2 for the jobs, git for the repository snapshots
FROM python:3.12-slim AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap libseccomp2 git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 dockyard
COPY --from=build /opt/dockyard /opt/dockyard
ENV PATH=/opt/dockyard/bin:$PATH
WORKDIR /app
USER 10001
EXPOSE 8700
# The bearer token comes from $DOCKYARD_SANDBOX_TOKEN (at least 16 bytes); repository snapshots
# from a volume at /repos.
ENTRYPOINT ["dockyard", "--log-format", "json"]
CMD ["sandbox", "serve", "--host", "0.0.0.0", "--port", "8700", "--repos", "/repos", \
     "--allow-plaintext"]
