# One queue-server node. With no arguments: a single node for clients on 0.0.0.0:1111 (TCP and
# UDP), its data in the /var/lib/queue-server volume, health on :9111 (/healthz, /readyz).
# docker-compose.yml runs three of them as a cluster, each with its own config.
# tests/integration/test_docker_image.py runs this file's command, environment and healthcheck
# without Docker (our machines have no Docker engine).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY queue_server ./queue_server
COPY server ./server
COPY workers ./workers
COPY replication ./replication
COPY election ./election
COPY config ./config
COPY client ./client
COPY spark ./spark
COPY protocol ./protocol
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --home-dir /var/lib/queue-server queue \
    && mkdir -p /var/lib/queue-server && chown queue /var/lib/queue-server
USER queue
VOLUME /var/lib/queue-server
# clients (TCP and UDP), peers (cluster_node_list ports in the compose configs), metrics + health,
# the HTTP API and status page
EXPOSE 1111/tcp 1111/udp 1101/tcp 9111/tcp 8080/tcp
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9111/readyz', timeout=2)"]
ENTRYPOINT ["queue-server"]
CMD ["--host", "0.0.0.0", "--data-dir", "/var/lib/queue-server", "--metrics-port", "9111", "--http-port", "8080"]
