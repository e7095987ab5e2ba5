/*
 * cbench: a small compiled closed-loop load client, so that the client is not the bottleneck
 * when measuring a Python server on 2 cores. One thread, epoll, C connections; each connection
 * runs produce -> consume -> confirm cycles with one request in flight, and records every
 * request's latency. The same client drives queue-server and the peers (beanstalkd, redis), so
 * their figures are comparable.
 *
 *   cbench PROTO HOST PORT CONNS SECONDS BATCH
 *     PROTO  qs | beanstalk | redis
 *     BATCH  messages per request (qs only; 1 = one message per request)
 *   prints one JSON line: {"ops":..., "messages":..., "seconds":..., "p50_ms":..., "p99_ms":...}
 *
 * Built by load/bench.py with `cc -O2 -o cbench cbench.c`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF (1 << 20)
#define MAXLAT (50 * 1000 * 1000)

enum proto { QS, BEANSTALK, REDIS };
enum step { PRODUCE, CONSUME, CONFIRM };

struct conn {
    int fd, id;
    enum step step;
    char *in;
    size_t in_len;
    char *out;
    size_t out_len, out_off;
    double sent_at;
    long ids[1000];
    int n_ids;
};

static enum proto proto;
static int batch = 1;
static double *lat;
static long n_lat, n_ops, n_msgs;
static char payload[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void build(struct conn *c) {
    char *o = c->out;
    size_t n = 0;
    char q[32];
    snprintf(q, sizeof q, "bench%d", c->id);
    if (proto == QS) {
        if (c->step == PRODUCE) {
            if (batch == 1) {
                n = sprintf(o, "{\"action\":1,\"queue\":\"%s\",\"data\":\"%s\",\"retry\":30}\n", q, payload);
            } else {
                n = sprintf(o, "{\"action\":1,\"queue\":\"%s\",\"retry\":30,\"data\":[", q);
                for (int i = 0; i < batch; i++) n += sprintf(o + n, "%s\"%s\"", i ? "," : "", payload);
                n += sprintf(o + n, "]}\n");
            }
        } else if (c->step == CONSUME) {
            if (batch == 1) n = sprintf(o, "{\"action\":2,\"queue\":\"%s\"}\n", q);
            else n = sprintf(o, "{\"action\":2,\"queue\":\"%s\",\"count\":%d}\n", q, batch);
        } else {
            if (batch == 1) {
                n = sprintf(o, "{\"action\":3,\"queue\":\"%s\",\"msg_id\":%ld}\n", q, c->ids[0]);
            } else {
                n = sprintf(o, "{\"action\":3,\"queue\":\"%s\",\"msg_ids\":[", q);
                for (int i = 0; i < c->n_ids; i++) n += sprintf(o + n, "%s%ld", i ? "," : "", c->ids[i]);
                n += sprintf(o + n, "]}\n");
            }
        }
    } else if (proto == BEANSTALK) {
        if (c->step == PRODUCE) n = sprintf(o, "put 0 0 30 %zu\r\n%s\r\n", strlen(payload), payload);
        else if (c->step == CONSUME) n = sprintf(o, "reserve-with-timeout 0\r\n");
        else n = sprintf(o, "delete %ld\r\n", c->ids[0]);
    } else {
        if (c->step == PRODUCE)
            n = sprintf(o, "*3\r\n$5\r\nLPUSH\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", strlen(q), q, strlen(payload), payload);
        else if (c->step == CONSUME)
            n = sprintf(o, "*5\r\n$5\r\nLMOVE\r\n$%zu\r\n%s\r\n$%zu\r\n%s:wip\r\n$5\r\nRIGHT\r\n$4\r\nLEFT\r\n",
                        strlen(q), q, strlen(q) + 4, q);
        else
            n = sprintf(o, "*4\r\n$4\r\nLREM\r\n$%zu\r\n%s:wip\r\n$1\r\n1\r\n$%zu\r\n%s\r\n", strlen(q) + 4, q,
                        strlen(payload), payload);
    }
    c->out_len = n;
    c->out_off = 0;
    c->sent_at = now();
}

/* Returns bytes consumed by one complete reply in c->in, or 0 if incomplete. Fills ids. */
static size_t parse(struct conn *c) {
    char *in = c->in, *end;
    in[c->in_len] = 0;
    if (proto == QS) {
        end = memchr(in, '\n', c->in_len);
        if (!end) return 0;
        if (!strstr(in, "\"code\":0")) { fprintf(stderr, "error reply: %.*s\n", (int)(end - in), in); exit(1); }
        c->n_ids = 0;
        if (c->step == CONSUME) {
            char *p = in;
            while ((p = strstr(p, "\"msg_id\":")) && p < end && c->n_ids < 1000) {
                c->ids[c->n_ids++] = strtol(p + 9, &p, 10);
            }
        }
        return end - in + 1;
    }
    if (proto == BEANSTALK) {
        end = strstr(in, "\r\n");
        if (!end) return 0;
        size_t head = end - in + 2;
        if (c->step == CONSUME) {
            long id; size_t bytes;
            if (sscanf(in, "RESERVED %ld %zu", &id, &bytes) != 2) { fprintf(stderr, "beanstalk: %.*s\n", (int)head, in); exit(1); }
            if (c->in_len < head + bytes + 2) return 0;
            c->ids[0] = id; c->n_ids = 1;
            return head + bytes + 2;
        }
        if (strncmp(in, "INSERTED", 8) && strncmp(in, "DELETED", 7)) { fprintf(stderr, "beanstalk: %.*s\n", (int)head, in); exit(1); }
        return head;
    }
    /* redis: integer (:n), bulk ($n ... ) */
    end = strstr(in, "\r\n");
    if (!end) return 0;
    size_t head = end - in + 2;
    if (in[0] == '$') {
        long bytes = strtol(in + 1, NULL, 10);
        if (bytes < 0) { fprintf(stderr, "redis: empty\n"); exit(1); }
        if (c->in_len < head + bytes + 2) return 0;
        c->n_ids = 1;
        return head + bytes + 2;
    }
    if (in[0] == '-') { fprintf(stderr, "redis: %.*s\n", (int)head, in); exit(1); }
    return head;
}

static void flush(struct conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EAGAIN) return;
            perror("write"); exit(1);
        }
        c->out_off += w;
    }
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: cbench qs|beanstalk|redis HOST PORT CONNS SECONDS BATCH\n"); return 2; }
    proto = !strcmp(argv[1], "qs") ? QS : !strcmp(argv[1], "beanstalk") ? BEANSTALK : REDIS;
    int nconn = atoi(argv[4]);
    double seconds = atof(argv[5]);
    batch = atoi(argv[6]);
    if (batch < 1 || batch > 1000 || (batch > 1 && proto != QS)) { fprintf(stderr, "bad batch\n"); return 2; }
    lat = malloc(sizeof(double) * MAXLAT);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
    inet_pton(AF_INET, argv[2], &addr.sin_addr);
    int ep = epoll_create1(0);
    struct conn *conns = calloc(nconn, sizeof *conns);
    for (int i = 0; i < nconn; i++) {
        struct conn *c = &conns[i];
        c->id = i;
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr)) { perror("connect"); return 1; }
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->in = malloc(BUF + 1);
        c->out = malloc(BUF);
        c->step = PRODUCE;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    if (proto == BEANSTALK) { /* watch/use default tube: nothing to do */ }
    double start = now(), stop = start + seconds;
    for (int i = 0; i < nconn; i++) { build(&conns[i]); flush(&conns[i]); }
    struct epoll_event evs[256];
    int active = nconn;
    while (active > 0) {
        int n = epoll_wait(ep, evs, 256, 1000);
        for (int k = 0; k < n; k++) {
            struct conn *c = evs[k].data.ptr;
            ssize_t r = read(c->fd, c->in + c->in_len, BUF - c->in_len);
            if (r <= 0) { if (r < 0 && errno == EAGAIN) continue; fprintf(stderr, "connection closed\n"); return 1; }
            c->in_len += r;
            size_t used;
            while ((used = parse(c)) > 0) {
                double t = now();
                if (n_lat < MAXLAT) lat[n_lat++] = t - c->sent_at;
                n_ops++;
                memmove(c->in, c->in + used, c->in_len - used);
                c->in_len -= used;
                if (c->step == PRODUCE) {
                    c->step = CONSUME;
                } else if (c->step == CONSUME) {
                    if (c->n_ids == 0) { c->step = PRODUCE; }
                    else { c->step = CONFIRM; n_msgs += c->n_ids; }
                } else {
                    c->step = PRODUCE;
                }
                if (t >= stop && c->step == PRODUCE) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    active--;
                    break;
                }
                build(c);
                flush(c);
            }
        }
    }
    double elapsed = now() - start;
    qsort(lat, n_lat, sizeof(double), cmp);
    printf("{\"ops\":%ld,\"messages\":%ld,\"seconds\":%.3f,\"ops_per_s\":%.0f,\"messages_per_s\":%.0f,"
           "\"p50_ms\":%.3f,\"p99_ms\":%.3f}\n",
           n_ops, n_msgs, elapsed, n_ops / elapsed, n_msgs / elapsed,
           n_lat ? lat[n_lat / 2] * 1e3 : 0, n_lat ? lat[(long)(n_lat * 0.99)] * 1e3 : 0);
    return 0;
}
