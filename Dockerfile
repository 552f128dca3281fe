# ctxapp: one image for web, worker and beat (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CTXAPP_DATA_DIR=/var/lib/ctxapp \
    CTXAPP_HOST=0.0.0.0 \
    CTXAPP_PORT=8000

WORKDIR /app

# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN mkdir -p ctxapp memory dashboard && touch ctxapp/__init__.py memory/__init__.py dashboard/__init__.py \
    && pip install -e . \
    && rm -rf ctxapp memory dashboard

COPY manage.py ./
COPY ctxapp ./ctxapp
COPY memory ./memory
COPY dashboard ./dashboard
COPY templates ./templates
COPY static ./static

RUN useradd --system --home-dir /var/lib/ctxapp --create-home ctxapp
USER ctxapp

EXPOSE 8000
# Static files are served by WhiteNoise from the app directories: no collectstatic step.
CMD ["ctxapp", "web"]
