# syntax=docker/dockerfile:1
# Build stage: install the pinned dependencies and the service into a virtualenv, compiling the simulator's
# hot modules with mypyc (setup.py), which needs a C compiler; the runtime image gets the result, not gcc.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
COPY pyproject.toml constraints.txt setup.py ./
COPY app ./app
RUN /opt/venv/bin/pip install -c constraints.txt .

# Runtime stage: only the virtualenv, the migrations and a non-root user.
FROM python:3.11-slim AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOST=0.0.0.0 \
    PORT=8000 \
    MPLCONFIGDIR=/tmp/matplotlib \
    DATABASE_URL=sqlite:////var/lib/sizing/sizing.db
RUN groupadd --system --gid 10001 sizing && useradd --system --uid 10001 --gid sizing --home-dir /srv sizing \
    && mkdir -p /var/lib/sizing && chown 10001:10001 /var/lib/sizing
WORKDIR /srv
COPY --from=build /opt/venv /opt/venv
COPY pyproject.toml ./
COPY migrations ./migrations
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\", \"8000\")}/healthz', timeout=2)"]
# Migrations are a separate step: `docker run --rm IMAGE alembic upgrade head` (see README).
CMD ["uvicorn", "--factory", "app.main:create_app", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers", "--no-access-log", "--no-server-header"]
