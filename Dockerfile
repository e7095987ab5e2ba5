# One queue-server node. docker-compose.yml runs three of them as a cluster.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY queue_server ./queue_server
COPY server ./server
COPY workers ./workers
COPY replication ./replication
COPY election ./election
COPY config ./config
COPY client ./client
COPY spark ./spark
RUN pip install --no-cache-dir . && mkdir -p /var/lib/queue-server
VOLUME /var/lib/queue-server
ENTRYPOINT ["queue-server"]
CMD ["--config", "/app/config/compose/node1.json"]
