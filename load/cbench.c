/*
 * cbench: a small compiled closed-loop load client, so that the client is not the bottleneck
 * when measuring a Python server on 2 cores. One thread, epoll. The same client drives
 * queue-server and the peers (beanstalkd, redis), so their figures are comparable.
 *
 *   cbench [options]
 *     -p PROTO   qs | beanstalk | redis                           (qs)
 *     -a ADDRS   host:port[,host:port...]; connection i uses address i % n   (127.0.0.1:1111)
 *     -c CONNS   connections                                      (8)
 *     -t SECS    seconds to run                                   (10)
 *     -b BATCH   messages per request, qs only (1..1000)          (1)
 *     -d DEPTH   cycle: requests in flight per connection (pipelining);
 *                longpoll: messages in flight per producer/consumer pair    (1)
 *     -m MODE    cycle | longpoll                                 (cycle)
 *     -s SIZE    payload bytes (>= 24)                             (64)
 *     -w WAIT    longpoll: the consumers' wait, seconds            (1)
 *     -q QUEUES  cycle, qs and redis: spread the cycles over this many queues (lists), each on
 *                the next one (bench0 .. bench<QUEUES-1>); 0: one queue per connection     (0)
 *     -k TOKEN   qs: authenticate every connection first ({"action":"auth","token":TOKEN};
 *                the node's auth_token_file), before the clock starts      (none)
 *
 *   cycle:    every connection runs DEPTH independent produce -> consume -> confirm loops
 *             (qs: retry 30; beanstalk: put/reserve-with-timeout 0/delete; redis:
 *             LPUSH/LMOVE to a work list/LREM). Replies come back in request order, so a FIFO
 *             of the lanes in flight says which loop each reply belongs to.
 *   longpoll: connections form producer/consumer pairs, one queue (tube, list) per pair. The
 *             consumer long-polls (qs: consume with wait; beanstalk: reserve-with-timeout WAIT;
 *             redis: BLMOVE ... WAIT) and confirms what it gets; the producer keeps DEPTH
 *             messages in flight to it, each stamped with its send time, so the delivery
 *             latency (produce sent -> consume reply read) is measured per message.
 *
 * Prints one JSON line: ops, messages, seconds, ops_per_s, messages_per_s, p50_ms, p99_ms
 * (request latency), and for longpoll delivery_p50_ms, delivery_p99_ms. Any error reply stops
 * the run with exit status 1 and the reply on stderr.
 *
 * Built by load/bench.py with `cc -O2 -o cbench cbench.c`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define INBUF (4 << 20)
#define MAXLAT (20 * 1000 * 1000)
#define MAXIDS 1000
#define MAXDEPTH 1024

enum proto { QS, BEANSTALK, REDIS };
enum mode { CYCLE, LONGPOLL };
enum step { PRODUCE, CONSUME, CONFIRM };
enum role { BOTH, PRODUCER, CONSUMER };

struct lane {
    enum step step;
    double sent_at;
    long ids[MAXIDS];
    int n_ids;
    char q[32];  /* -q: the queue of this lane's current cycle */
    char *taken; /* redis: the value LMOVE returned, for LREM */
    size_t taken_len;
};

struct pair;

struct conn {
    int fd, id;
    enum role role;
    struct pair *pair;
    char q[64];
    char *in;
    size_t in_len;
    char *out;
    size_t out_len, out_off, out_cap;
    struct lane *lanes;
    int n_lanes;
    int fifo[MAXDEPTH]; /* lanes in flight, oldest first */
    int fifo_head, fifo_n;
    int done, want_out;
};

struct pair {
    struct conn *producer, *consumer;
    int in_flight; /* messages produced (or being produced) and not yet delivered */
    int producer_idle;
};

static enum proto proto = QS;
static enum mode mode = CYCLE;
static int batch = 1, depth = 1, payload_size = 64;
static double wait_s = 1;
static long n_queues, next_queue;
static double *lat, *dlat;
static long n_lat, n_dlat, n_ops, n_msgs;
static char *payload;
static double stop_at;
static int ep;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, const char *text, size_t len) {
    fprintf(stderr, "cbench: %s: %.*s\n", what, (int)(len > 400 ? 400 : len), text);
    exit(1);
}

static void reserve_out(struct conn *c, size_t more) {
    if (c->out_len + more <= c->out_cap) return;
    if (c->out_off) { /* compact first */
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
        if (c->out_len + more <= c->out_cap) return;
    }
    while (c->out_len + more > c->out_cap) c->out_cap *= 2;
    c->out = realloc(c->out, c->out_cap);
}

/* The payload of a message: stamped with the send time in longpoll mode. */
static const char *message(double t) {
    if (mode == LONGPOLL) {
        char stamp[32];
        int n = snprintf(stamp, sizeof stamp, "t%.9f|", t);
        memcpy(payload, stamp, n);
    }
    return payload;
}

/* Append the request for lane `li` of `c` to its output and put the lane in the FIFO. */
static void build(struct conn *c, int li) {
    struct lane *l = &c->lanes[li];
    if (n_queues && mode == CYCLE && l->step == PRODUCE) snprintf(l->q, sizeof l->q, "bench%ld", next_queue++ % n_queues);
    const char *q = n_queues && mode == CYCLE ? l->q : c->q;
    size_t qn = strlen(q), pn = (size_t)payload_size;
    reserve_out(c, (size_t)batch * (pn + 24) + 256);
    char *o = c->out + c->out_len;
    size_t n = 0;
    double t = now();
    if (proto == QS) {
        if (l->step == PRODUCE) {
            const char *data = message(t);
            if (batch == 1) {
                n = sprintf(o, "{\"action\":1,\"queue\":\"%s\",\"retry\":30,\"data\":\"%s\"}\n", q, data);
            } else {
                n = sprintf(o, "{\"action\":1,\"queue\":\"%s\",\"retry\":30,\"data\":[", q);
                for (int i = 0; i < batch; i++) n += sprintf(o + n, "%s\"%s\"", i ? "," : "", data);
                n += sprintf(o + n, "]}\n");
            }
        } else if (l->step == CONSUME) {
            if (mode == LONGPOLL) n = sprintf(o, "{\"action\":2,\"queue\":\"%s\",\"wait\":%g}\n", q, wait_s);
            else if (batch == 1) n = sprintf(o, "{\"action\":2,\"queue\":\"%s\"}\n", q);
            else n = sprintf(o, "{\"action\":2,\"queue\":\"%s\",\"count\":%d}\n", q, batch);
        } else {
            if (l->n_ids == 1) {
                n = sprintf(o, "{\"action\":3,\"queue\":\"%s\",\"msg_id\":%ld}\n", q, l->ids[0]);
            } else {
                n = sprintf(o, "{\"action\":3,\"queue\":\"%s\",\"msg_ids\":[", q);
                for (int i = 0; i < l->n_ids; i++) n += sprintf(o + n, "%s%ld", i ? "," : "", l->ids[i]);
                n += sprintf(o + n, "]}\n");
            }
        }
    } else if (proto == BEANSTALK) {
        if (l->step == PRODUCE) n = sprintf(o, "put 0 0 30 %zu\r\n%s\r\n", pn, message(t));
        else if (l->step == CONSUME) n = sprintf(o, "reserve-with-timeout %d\r\n", mode == LONGPOLL ? (int)(wait_s + 0.5) : 0);
        else n = sprintf(o, "delete %ld\r\n", l->ids[0]);
    } else {
        if (l->step == PRODUCE) {
            n = sprintf(o, "*3\r\n$5\r\nLPUSH\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", qn, q, pn, message(t));
        } else if (l->step == CONSUME) {
            if (mode == LONGPOLL)
                n = sprintf(o, "*6\r\n$6\r\nBLMOVE\r\n$%zu\r\n%s\r\n$%zu\r\n%s:wip\r\n$5\r\nRIGHT\r\n$4\r\nLEFT\r\n$1\r\n%d\r\n",
                            qn, q, qn + 4, q, (int)(wait_s + 0.5));
            else
                n = sprintf(o, "*5\r\n$5\r\nLMOVE\r\n$%zu\r\n%s\r\n$%zu\r\n%s:wip\r\n$5\r\nRIGHT\r\n$4\r\nLEFT\r\n",
                            qn, q, qn + 4, q);
        } else {
            n = sprintf(o, "*4\r\n$4\r\nLREM\r\n$%zu\r\n%s:wip\r\n$1\r\n1\r\n$%zu\r\n", qn + 4, q, l->taken_len);
            memcpy(o + n, l->taken, l->taken_len);
            n += l->taken_len;
            memcpy(o + n, "\r\n", 2);
            n += 2;
        }
    }
    c->out_len += n;
    l->sent_at = t;
    c->fifo[(c->fifo_head + c->fifo_n) % MAXDEPTH] = li;
    c->fifo_n++;
}

static void flush(struct conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EAGAIN) {
                if (!c->want_out) {
                    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                    c->want_out = 1;
                }
                return;
            }
            perror("write");
            exit(1);
        }
        c->out_off += w;
    }
    c->out_off = c->out_len = 0;
    if (c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = 0;
    }
}

/* The send time stamped in a longpoll message, found at `p` ("t<seconds>|"). */
static void delivered(const char *p, const char *end) {
    if (p < end && *p == 't') {
        double sent = strtod(p + 1, NULL);
        if (n_dlat < MAXLAT) dlat[n_dlat++] = now() - sent;
    }
}

/*
 * Parse one complete reply for lane `l` from in[0..len). Returns the bytes it used, or 0 if the
 * reply is not complete yet. Sets l->n_ids to the messages a consume got (0: none).
 */
static size_t parse(struct lane *l, char *in, size_t len) {
    char *end;
    if (proto == QS) {
        end = memchr(in, '\n', len);
        if (!end) return 0;
        if (!memmem(in, end - in, "\"code\":0", 8)) die("error reply", in, end - in);
        if (l->step == CONSUME) {
            l->n_ids = 0;
            char *p = in;
            while ((p = memmem(p, end - p, "\"msg_id\":", 9)) && l->n_ids < MAXIDS) {
                l->ids[l->n_ids++] = strtol(p + 9, &p, 10);
                if (mode == LONGPOLL) {
                    char *d = memmem(p, end - p, "\"data\":\"", 8);
                    if (d) delivered(d + 8, end);
                }
            }
        }
        return end - in + 1;
    }
    if (proto == BEANSTALK) {
        end = memmem(in, len, "\r\n", 2);
        if (!end) return 0;
        size_t head = end - in + 2;
        if (l->step == CONSUME) {
            long id;
            size_t bytes;
            if (!strncmp(in, "TIMED_OUT", 9) || !strncmp(in, "DEADLINE_SOON", 13)) {
                l->n_ids = 0;
                return head;
            }
            if (sscanf(in, "RESERVED %ld %zu", &id, &bytes) != 2) die("beanstalk", in, head);
            if (len < head + bytes + 2) return 0;
            if (mode == LONGPOLL) delivered(in + head, in + head + bytes);
            l->ids[0] = id;
            l->n_ids = 1;
            return head + bytes + 2;
        }
        if (strncmp(in, "INSERTED", 8) && strncmp(in, "DELETED", 7)) die("beanstalk", in, head);
        return head;
    }
    /* redis: integer (:n), bulk ($n), null (*-1 / $-1), error (-...) */
    end = memmem(in, len, "\r\n", 2);
    if (!end) return 0;
    size_t head = end - in + 2;
    if (in[0] == '-') die("redis", in, head);
    if (l->step == CONSUME) {
        long bytes = (in[0] == '$') ? strtol(in + 1, NULL, 10) : -1;
        if (bytes < 0) {
            l->n_ids = 0;
            return head;
        }
        if ((long)len < (long)head + bytes + 2) return 0;
        l->taken = realloc(l->taken, bytes + 1);
        memcpy(l->taken, in + head, bytes);
        l->taken_len = bytes;
        if (mode == LONGPOLL) delivered(in + head, in + head + bytes);
        l->n_ids = 1;
        return head + bytes + 2;
    }
    return head;
}

static void finish(struct conn *c) {
    if (c->done) return;
    c->done = 1;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
}

/* A reply for the oldest lane in flight on `c` arrived: move that lane on. */
static void advance(struct conn *c, double t) {
    int li = c->fifo[c->fifo_head];
    c->fifo_head = (c->fifo_head + 1) % MAXDEPTH;
    c->fifo_n--;
    struct lane *l = &c->lanes[li];
    int running = t < stop_at;
    if (mode == CYCLE) {
        if (l->step == PRODUCE) l->step = CONSUME;
        else if (l->step == CONSUME) {
            if (l->n_ids) { l->step = CONFIRM; n_msgs += l->n_ids; }
            else l->step = PRODUCE;
        } else l->step = PRODUCE;
        if (running || l->step != PRODUCE) build(c, li);
        return;
    }
    struct pair *pr = c->pair;
    if (c->role == PRODUCER) {
        if (running && pr->in_flight < depth) { pr->in_flight++; build(c, li); }
        else pr->producer_idle = 1;
        return;
    }
    if (l->step == CONSUME && l->n_ids) {
        n_msgs += l->n_ids;
        pr->in_flight -= l->n_ids;
        l->step = CONFIRM;
        build(c, li);
        if (pr->producer_idle && running && pr->in_flight < depth) {
            struct conn *p = pr->producer;
            pr->producer_idle = 0;
            pr->in_flight++;
            build(p, 0);
            flush(p);
        }
        return;
    }
    l->step = CONSUME;
    if (running) build(c, li);
}

static int open_conn(const char *host, const char *port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc) { fprintf(stderr, "cbench: %s:%s: %s\n", host, port, gai_strerror(rc)); exit(1); }
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (connect(fd, res->ai_addr, res->ai_addrlen)) { fprintf(stderr, "cbench: connect %s:%s: %s\n", host, port, strerror(errno)); exit(1); }
    freeaddrinfo(res);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Blocking request/one-line-reply before the run: beanstalk tube setup (the reply starts with
   `expect`), qs authentication (the reply contains `expect`). */
static void setup_line(int fd, const char *cmd, const char *expect) {
    char buf[512];
    size_t n = 0;
    if (write(fd, cmd, strlen(cmd)) < 0) { perror("write"); exit(1); }
    while (n < sizeof buf - 1) {
        ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
        if (r <= 0) { perror("read"); exit(1); }
        n += r;
        if (memchr(buf, '\n', n)) break;
    }
    buf[n] = 0;
    if (proto == QS ? !strstr(buf, expect) : strncmp(buf, expect, strlen(expect))) die("setup", buf, n);
}

int main(int argc, char **argv) {
    const char *addrs = "127.0.0.1:1111";
    int nconn = 8;
    double seconds = 10;
    const char *token = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "p:a:c:t:b:d:m:s:w:k:q:")) != -1) {
        switch (opt) {
        case 'p': proto = !strcmp(optarg, "qs") ? QS : !strcmp(optarg, "beanstalk") ? BEANSTALK : !strcmp(optarg, "redis") ? REDIS : -1; break;
        case 'a': addrs = optarg; break;
        case 'c': nconn = atoi(optarg); break;
        case 't': seconds = atof(optarg); break;
        case 'b': batch = atoi(optarg); break;
        case 'd': depth = atoi(optarg); break;
        case 'm': mode = !strcmp(optarg, "longpoll") ? LONGPOLL : !strcmp(optarg, "cycle") ? CYCLE : -1; break;
        case 's': payload_size = atoi(optarg); break;
        case 'w': wait_s = atof(optarg); break;
        case 'k': token = optarg; break;
        case 'q': n_queues = atol(optarg); break;
        default: fprintf(stderr, "usage: see the comment at the top of cbench.c\n"); return 2;
        }
    }
    if ((int)proto < 0 || (int)mode < 0 || batch < 1 || batch > MAXIDS || (batch > 1 && proto != QS) ||
        depth < 1 || depth > MAXDEPTH || n_queues < 0 || nconn < 1 || payload_size < 24 || (mode == LONGPOLL && (nconn % 2 || batch != 1))) {
        fprintf(stderr, "cbench: bad arguments (longpoll needs an even number of connections and batch 1)\n");
        return 2;
    }
    payload = malloc(payload_size + 1);
    for (int i = 0; i < payload_size; i++) payload[i] = "0123456789abcdef"[i % 16];
    payload[payload_size] = 0;
    lat = malloc(sizeof(double) * MAXLAT);
    dlat = malloc(sizeof(double) * MAXLAT);

    char *hosts[64], *ports[64];
    int n_addrs = 0;
    char *list = strdup(addrs), *save = NULL;
    for (char *a = strtok_r(list, ",", &save); a && n_addrs < 64; a = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(a, ':');
        if (!colon) { fprintf(stderr, "cbench: address %s needs a port\n", a); return 2; }
        *colon = 0;
        hosts[n_addrs] = a;
        ports[n_addrs++] = colon + 1;
    }

    ep = epoll_create1(0);
    struct conn *conns = calloc(nconn, sizeof *conns);
    struct pair *pairs = calloc(nconn / 2 + 1, sizeof *pairs);
    for (int i = 0; i < nconn; i++) {
        struct conn *c = &conns[i];
        c->id = i;
        c->fd = open_conn(hosts[i % n_addrs], ports[i % n_addrs]);
        if (token && proto == QS) {
            char cmd[512];
            snprintf(cmd, sizeof cmd, "{\"action\":\"auth\",\"token\":\"%s\"}\n", token);
            setup_line(c->fd, cmd, "\"code\":0");
        }
        c->in = malloc(INBUF + 1);
        c->out_cap = 1 << 16;
        c->out = malloc(c->out_cap);
        c->n_lanes = mode == CYCLE ? depth : 1;
        c->lanes = calloc(c->n_lanes, sizeof *c->lanes);
        if (mode == CYCLE) {
            c->role = BOTH;
            snprintf(c->q, sizeof c->q, "bench%d", i);
        } else {
            struct pair *pr = &pairs[i / 2];
            c->pair = pr;
            c->role = i % 2 ? CONSUMER : PRODUCER;
            if (c->role == PRODUCER) pr->producer = c; else pr->consumer = c;
            snprintf(c->q, sizeof c->q, "lp%d", i / 2);
            c->lanes[0].step = c->role == PRODUCER ? PRODUCE : CONSUME;
            if (proto == BEANSTALK) {
                char cmd[128];
                if (c->role == PRODUCER) {
                    snprintf(cmd, sizeof cmd, "use %s\r\n", c->q);
                    setup_line(c->fd, cmd, "USING");
                } else {
                    snprintf(cmd, sizeof cmd, "watch %s\r\n", c->q);
                    setup_line(c->fd, cmd, "WATCHING");
                    setup_line(c->fd, "ignore default\r\n", "WATCHING");
                }
            }
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
    }
    double start = now();
    stop_at = start + seconds;
    /* consumers first, so that their long polls are parked before the first message */
    for (int i = 0; i < nconn; i++) {
        struct conn *c = &conns[i];
        if (c->role == PRODUCER) continue;
        for (int li = 0; li < c->n_lanes; li++) build(c, li);
        flush(c);
    }
    for (int i = 0; i < nconn; i++) {
        struct conn *c = &conns[i];
        if (c->role != PRODUCER) continue;
        c->pair->in_flight = 1;
        build(c, 0);
        flush(c);
    }
    struct epoll_event evs[256];
    int active = nconn;
    while (active > 0) {
        int n = epoll_wait(ep, evs, 256, 200);
        double t = now();
        if (n == 0 && t > stop_at + wait_s + 30) { fprintf(stderr, "cbench: replies stopped coming\n"); return 1; }
        for (int k = 0; k < n; k++) {
            struct conn *c = evs[k].data.ptr;
            if (c->done) continue;
            if (evs[k].events & EPOLLOUT) flush(c);
            if (!(evs[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
            ssize_t r = read(c->fd, c->in + c->in_len, INBUF - c->in_len);
            if (r <= 0) {
                if (r < 0 && errno == EAGAIN) continue;
                fprintf(stderr, "cbench: connection %d closed by the server\n", c->id);
                return 1;
            }
            c->in_len += r;
            c->in[c->in_len] = 0;
            size_t used, off = 0;
            while (c->fifo_n > 0) {
                struct lane *l = &c->lanes[c->fifo[c->fifo_head]];
                used = parse(l, c->in + off, c->in_len - off);
                if (!used) break;
                t = now();
                if (n_lat < MAXLAT) lat[n_lat++] = t - l->sent_at;
                n_ops++;
                off += used;
                advance(c, t);
            }
            if (off) {
                memmove(c->in, c->in + off, c->in_len - off);
                c->in_len -= off;
            }
            if (c->in_len >= INBUF) die("reply too large", c->in, 200);
            flush(c);
            if (c->fifo_n == 0 && t >= stop_at) { finish(c); active--; }
        }
        /* a producer whose consumer is done has nothing left to wait for */
        if (mode == LONGPOLL && t >= stop_at)
            for (int i = 0; i < nconn; i++)
                if (!conns[i].done && conns[i].role == PRODUCER && conns[i].fifo_n == 0) { finish(&conns[i]); active--; }
    }
    double elapsed = now() - start;
    qsort(lat, n_lat, sizeof(double), cmp);
    printf("{\"ops\":%ld,\"messages\":%ld,\"seconds\":%.3f,\"ops_per_s\":%.0f,\"messages_per_s\":%.0f,"
           "\"p50_ms\":%.3f,\"p99_ms\":%.3f",
           n_ops, n_msgs, elapsed, n_ops / elapsed, n_msgs / elapsed,
           n_lat ? lat[n_lat / 2] * 1e3 : 0, n_lat ? lat[(long)(n_lat * 0.99)] * 1e3 : 0);
    if (mode == LONGPOLL) {
        qsort(dlat, n_dlat, sizeof(double), cmp);
        printf(",\"delivery_p50_ms\":%.3f,\"delivery_p99_ms\":%.3f",
               n_dlat ? dlat[n_dlat / 2] * 1e3 : 0, n_dlat ? dlat[(long)(n_dlat * 0.99)] * 1e3 : 0);
    }
    printf("}\n");
    return 0;
}
