# One image for every dockyard role; docker-compose.yml picks the role by command.
FROM python:3.11-slim
WORKDIR /app
# bubblewrap: namespaces of every sandboxed run; libseccomp2: its syscall filter (pyseccomp loads
# it); docs/operations.md, Isolation of one run
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap libseccomp2 \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY constraints ./constraints
COPY dockyard ./dockyard
COPY configs ./configs
# constraints/cpu.txt: torch's CPU build (and the PyTorch CPU index it is on). The CUDA images per
# role are under deploy/images/ (docs/deployment.md).
RUN pip install --no-cache-dir -e . -c constraints/cpu.txt
ENTRYPOINT ["dockyard", "--log-format", "json"]
