# One image for every Flotilla process: the seven services, kubesim and the
# `flotilla` command. Build stage: uv installs the locked workspace into a venv;
# runtime stage: that venv on a slim Python, run as an unprivileged user.
FROM python:3.11-slim AS build
ENV UV_PROJECT_ENVIRONMENT=/opt/flotilla UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1
RUN pip install --no-cache-dir uv==0.13.8
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
COPY libs libs
COPY services services
RUN uv sync --frozen --all-packages --no-dev --no-editable

FROM python:3.11-slim
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin flotilla \
    && mkdir -p /kube /var/lib/flotilla && chown 10001:10001 /kube /var/lib/flotilla
COPY --from=build /opt/flotilla /opt/flotilla
COPY deploy/k8s/crds /opt/flotilla/crds
ENV PATH=/opt/flotilla/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FLOTILLA_CRD_DIR=/opt/flotilla/crds
USER 10001:10001
WORKDIR /var/lib/flotilla
EXPOSE 8081 8082 8083 8084 8085 8086 8087
CMD ["flotilla", "--help"]
