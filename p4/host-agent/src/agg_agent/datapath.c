/* The aggregation protocol's host data path in C: a worker's exchange and the parameter
 * server's serving loop, with batched socket calls (sendmmsg / recvmmsg).
 *
 * The same state machines as agg_agent/endpoints.py (`Worker.exchange`,
 * `ParameterServer.serve`), which stays the readable reference: the same packets on the
 * wire, the same windows, retransmissions, runs, status acknowledgements and sequence
 * numbers modulo 2^32 (docs/protocols.md). tests/agent/test_datapath.py runs both on the
 * same buckets and requires identical sums. Built by agg_agent/native.py with the
 * machine's C compiler on first use; called through ctypes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>

#define LANES 32
#define HEADER 20
#define PACKET (HEADER + 4 * LANES)
#define BATCH 64
#define F_AGGREGATED 0x01
#define F_RETRANSMIT 0x02
#define F_ACK 0x04
#define F_ECN_ECHO 0x08
#define F_JOIN 0x10
#define F_END 0x20
#define MAX_WORKERS 32

int agg_lanes(void) { return LANES; }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
    uint16_t job, slot;
    uint8_t worker, fan_in, flags, queue;
    uint32_t contributors, seq, run;
} header_t;

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void encode_header(uint8_t *p, const header_t *h) {
    put16(p, h->job); put16(p + 2, h->slot);
    p[4] = h->worker; p[5] = h->fan_in; p[6] = h->flags; p[7] = h->queue;
    put32(p + 8, h->contributors); put32(p + 12, h->seq); put32(p + 16, h->run);
}

static void decode_header(const uint8_t *p, header_t *h) {
    h->job = get16(p); h->slot = get16(p + 2);
    h->worker = p[4]; h->fan_in = p[5]; h->flags = p[6]; h->queue = p[7];
    h->contributors = get32(p + 8); h->seq = get32(p + 12); h->run = get32(p + 16);
}

/* A difference of sequence numbers modulo 2^32, as the nearest signed value. */
static int64_t signed32(int64_t d) {
    d &= 0xFFFFFFFFLL;
    return d >= 0x80000000LL ? d - 0x100000000LL : d;
}

/* ------------------------------------------------------------------ worker ---------- */

typedef struct {
    int32_t fd;
    uint32_t target_ip;    /* network order */
    uint16_t target_port;  /* network order */
    uint16_t job;
    uint8_t worker, fan_in;
    uint16_t window;
    uint32_t run;
    double timeout_s;
    double deadline_s;     /* < 0: none */
    int64_t max_retries;
} worker_cfg;

typedef struct {
    int64_t packets, retrans;
    double seconds;
    double srtt;           /* in and out; < 0: none measured yet */
    int32_t fail;          /* 0 done; 1 a chunk unacknowledged (fail_*); 2 the PS restarted;
                              3 a socket error (fail_errno) */
    int32_t fail_errno;
    int64_t fail_chunk;    /* the chunk's index in this exchange */
    double fail_waited;
    int64_t fail_holds;    /* -1: the PS never said who it holds */
    uint32_t reset_run;
    int64_t queue_counts[256];
} worker_out;

/* Send `chunks` chunks of `q` (chunks * LANES int32) from index `first` on; every worker's
 * sum into `sums` (chunks * LANES int64). Returns 0, or -1 with out->fail set. */
int agg_worker_exchange(const worker_cfg *cfg, int64_t first, const int32_t *q, int64_t chunks,
                        int32_t end, int64_t *sums, worker_out *out) {
    const uint32_t everyone = cfg->fan_in >= 32 ? 0xFFFFFFFFu : ((1u << cfg->fan_in) - 1);
    uint8_t *acked = calloc((size_t)chunks + 1, 1);
    double *sent_at = malloc(sizeof(double) * ((size_t)chunks + 1));
    double *born = malloc(sizeof(double) * ((size_t)chunks + 1));
    int64_t *tries = calloc((size_t)chunks + 1, sizeof(int64_t));
    int64_t *missing = malloc(sizeof(int64_t) * ((size_t)chunks + 1));
    static __thread uint8_t sbuf[BATCH][PACKET], rbuf[BATCH][PACKET + 64];
    struct mmsghdr smsg[BATCH], rmsg[BATCH];
    struct iovec siov[BATCH], riov[BATCH];
    struct sockaddr_in to = {0};
    int rc = 0;
    const double start = now_s();
    if (!acked || !sent_at || !born || !tries || !missing) {
        out->fail = 3; out->fail_errno = ENOMEM; rc = -1; goto done;
    }
    for (int64_t c = 0; c < chunks; c++) { sent_at[c] = -1.0; missing[c] = -1; }
    to.sin_family = AF_INET; to.sin_addr.s_addr = cfg->target_ip; to.sin_port = cfg->target_port;
    memset(smsg, 0, sizeof smsg); memset(rmsg, 0, sizeof rmsg);
    for (int i = 0; i < BATCH; i++) {
        siov[i].iov_base = sbuf[i]; siov[i].iov_len = PACKET;
        smsg[i].msg_hdr.msg_iov = &siov[i]; smsg[i].msg_hdr.msg_iovlen = 1;
        smsg[i].msg_hdr.msg_name = &to; smsg[i].msg_hdr.msg_namelen = sizeof to;
        riov[i].iov_base = rbuf[i]; riov[i].iov_len = sizeof rbuf[i];
        rmsg[i].msg_hdr.msg_iov = &riov[i]; rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    header_t h = {cfg->job, 0, cfg->worker, cfg->fan_in, 0, 0, 1u << cfg->worker, 0, cfg->run};
    int64_t low = 0, nxt = 0;
    out->fail = 0;
    while (low < chunks) {
        int ns = 0;
        /* new chunks, within the window past the oldest unacknowledged one */
        while (nxt < chunks && nxt < low + cfg->window && ns < BATCH) {
            int64_t index = first + nxt;
            h.slot = (uint16_t)(index % cfg->window);
            h.seq = (uint32_t)(index & 0xFFFFFFFFLL);
            h.flags = (end && nxt == chunks - 1) ? F_END : 0;
            encode_header(sbuf[ns], &h);
            for (int l = 0; l < LANES; l++) put32(sbuf[ns] + HEADER + 4 * l, (uint32_t)q[nxt * LANES + l]);
            sent_at[nxt] = born[nxt] = now_s();
            tries[nxt] = 0;
            nxt++; ns++;
        }
        /* retransmissions of chunks unacknowledged for `timeout_s` */
        double t = now_s();
        for (int64_t c = low; c < nxt && ns < BATCH; c++) {
            if (acked[c] || sent_at[c] < 0 || t - sent_at[c] < cfg->timeout_s) continue;
            tries[c]++;
            int late = cfg->deadline_s >= 0 && t - born[c] > cfg->deadline_s;
            if (tries[c] > cfg->max_retries || late) {
                out->fail = 1; out->fail_chunk = c; out->fail_waited = t - born[c];
                out->fail_holds = missing[c]; rc = -1; goto done;
            }
            int64_t index = first + c;
            h.slot = (uint16_t)(index % cfg->window);
            h.seq = (uint32_t)(index & 0xFFFFFFFFLL);
            h.flags = F_RETRANSMIT | ((end && c == chunks - 1) ? F_END : 0);
            encode_header(sbuf[ns], &h);
            for (int l = 0; l < LANES; l++) put32(sbuf[ns] + HEADER + 4 * l, (uint32_t)q[c * LANES + l]);
            sent_at[c] = t;
            out->retrans++; ns++;
        }
        for (int off = 0; off < ns;) {
            int k = sendmmsg(cfg->fd, smsg + off, (unsigned)(ns - off), 0);
            if (k < 0) {
                if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) continue;
                out->fail = 3; out->fail_errno = errno; rc = -1; goto done;
            }
            off += k;
        }
        out->packets += ns;
        /* wait for acknowledgements until the oldest in-flight chunk's timer fires */
        double oldest = 1e300;
        for (int64_t c = low; c < nxt; c++)
            if (!acked[c] && sent_at[c] >= 0 && sent_at[c] < oldest) oldest = sent_at[c];
        double wait = oldest + cfg->timeout_s - now_s();
        if (nxt < chunks && nxt < low + cfg->window) wait = 0;  /* room to send more */
        struct pollfd pfd = {cfg->fd, POLLIN, 0};
        int ms = wait <= 0 ? 0 : (int)(wait * 1000.0) + 1;
        int pr = poll(&pfd, 1, ms);
        if (pr < 0 && errno != EINTR) { out->fail = 3; out->fail_errno = errno; rc = -1; goto done; }
        if (pr <= 0) continue;
        int got = recvmmsg(cfg->fd, rmsg, BATCH, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            out->fail = 3; out->fail_errno = errno; rc = -1; goto done;
        }
        for (int i = 0; i < got; i++) {
            if (rmsg[i].msg_len < PACKET) continue;
            header_t a;
            decode_header(rbuf[i], &a);
            if (!(a.flags & F_ACK) || a.job != cfg->job) continue;
            if ((a.flags & F_JOIN) && a.run != cfg->run) {
                out->fail = 2; out->reset_run = a.run; rc = -1; goto done;
            }
            if (a.flags & F_JOIN || a.run != cfg->run) continue;
            int64_t c = (int64_t)(((uint64_t)a.seq - (uint64_t)first) & 0xFFFFFFFFULL);
            if (c >= chunks || acked[c]) continue;
            if (a.contributors != everyone) { missing[c] = a.contributors; continue; }
            acked[c] = 1;
            for (int l = 0; l < LANES; l++)
                sums[c * LANES + l] = (int32_t)get32(rbuf[i] + HEADER + 4 * l);
            if (sent_at[c] >= 0 && tries[c] == 0) {  /* Karn: first transmissions only */
                double rtt = now_s() - sent_at[c];
                out->srtt = out->srtt < 0 ? rtt : 0.875 * out->srtt + 0.125 * rtt;
            }
            sent_at[c] = -1.0;
            out->queue_counts[a.queue]++;
            while (low < chunks && acked[low]) low++;
        }
    }
done:
    out->seconds = now_s() - start;
    free(acked); free(sent_at); free(born); free(tries); free(missing);
    return rc;
}

/* ------------------------------------------------------------- parameter server ------ */

typedef struct {
    int64_t chunks, steps, aggregated, raw, duplicates, runs, other_runs;
    /* the step in progress */
    int64_t step_aggregated, step_raw;
} ps_stats;

typedef struct {
    int fd;
    uint16_t job;
    int workers;
    uint32_t all_mask;
    struct sockaddr_in addrs[MAX_WORKERS];
    uint32_t run, first_seq;
    int64_t retain;
    int64_t low;               /* the oldest index not complete */
    uint32_t nonces[MAX_WORKERS];
    /* per ring slot (index mod retain) */
    int64_t *idx;              /* the index it holds, -1: none */
    uint32_t *bitmap;
    uint8_t *complete, *end, *queue, *ce;
    int64_t *acc;              /* LANES a slot */
    double step_start;
    /* outgoing batch */
    struct mmsghdr smsg[BATCH];
    struct iovec siov[BATCH];
    uint8_t sbuf[BATCH][PACKET];
    int ns;
} ps_t;

void agg_ps_free(ps_t *ps) {
    if (!ps) return;
    free(ps->idx); free(ps->bitmap); free(ps->complete); free(ps->end); free(ps->queue);
    free(ps->ce); free(ps->acc); free(ps);
}

static void ps_clear(ps_t *ps) {
    for (int64_t i = 0; i < ps->retain; i++) ps->idx[i] = -1;
    ps->low = 0;
}

ps_t *agg_ps_new(int fd, uint16_t job, int workers, const uint32_t *ips, const uint16_t *ports,
                 uint32_t run, uint32_t first_seq, int64_t retain) {
    if (workers < 1 || workers > MAX_WORKERS || retain < 1) return NULL;
    ps_t *ps = calloc(1, sizeof *ps);
    if (!ps) return NULL;
    ps->fd = fd; ps->job = job; ps->workers = workers;
    ps->all_mask = workers >= 32 ? 0xFFFFFFFFu : ((1u << workers) - 1);
    ps->run = run; ps->first_seq = first_seq; ps->retain = retain;
    for (int w = 0; w < workers; w++) {
        ps->addrs[w].sin_family = AF_INET;
        ps->addrs[w].sin_addr.s_addr = ips[w];
        ps->addrs[w].sin_port = ports[w];
    }
    ps->idx = malloc(sizeof(int64_t) * (size_t)retain);
    ps->bitmap = calloc((size_t)retain, sizeof(uint32_t));
    ps->complete = calloc((size_t)retain, 1);
    ps->end = calloc((size_t)retain, 1);
    ps->queue = calloc((size_t)retain, 1);
    ps->ce = calloc((size_t)retain, 1);
    ps->acc = calloc((size_t)retain * LANES, sizeof(int64_t));
    if (!ps->idx || !ps->bitmap || !ps->complete || !ps->end || !ps->queue || !ps->ce || !ps->acc) {
        agg_ps_free(ps);
        return NULL;
    }
    ps_clear(ps);
    for (int i = 0; i < BATCH; i++) {
        ps->siov[i].iov_base = ps->sbuf[i]; ps->siov[i].iov_len = PACKET;
        ps->smsg[i].msg_hdr.msg_iov = &ps->siov[i]; ps->smsg[i].msg_hdr.msg_iovlen = 1;
        ps->smsg[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
    }
    ps->step_start = now_s();
    return ps;
}

uint32_t agg_ps_run(const ps_t *ps) { return ps->run; }

/* The workers' addresses changed (the Python server reads them at every send). */
void agg_ps_set_workers(ps_t *ps, const uint32_t *ips, const uint16_t *ports) {
    for (int w = 0; w < ps->workers; w++) {
        ps->addrs[w].sin_addr.s_addr = ips[w];
        ps->addrs[w].sin_port = ports[w];
    }
}

static void ps_flush(ps_t *ps) {
    for (int off = 0; off < ps->ns;) {
        int k = sendmmsg(ps->fd, ps->smsg + off, (unsigned)(ps->ns - off), 0);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) continue;
            break;  /* as sendto's errors are for the Python server: the sender retransmits */
        }
        off += k;
    }
    ps->ns = 0;
}

static void ps_send(ps_t *ps, int w, const header_t *h, const int64_t *values) {
    if (ps->ns == BATCH) ps_flush(ps);
    uint8_t *p = ps->sbuf[ps->ns];
    encode_header(p, h);
    for (int l = 0; l < LANES; l++) put32(p + HEADER + 4 * l, values ? (uint32_t)values[l] : 0);
    ps->smsg[ps->ns].msg_hdr.msg_name = &ps->addrs[w];
    ps->ns++;
}

static void answer_join(ps_t *ps, int w) {
    if (w < 0 || w >= ps->workers) return;
    header_t h = {ps->job, 0, (uint8_t)w, (uint8_t)ps->workers, F_ACK | F_JOIN, 0, ps->all_mask, 0, ps->run};
    ps_send(ps, w, &h, NULL);
}

static void ack(ps_t *ps, uint32_t seq, uint32_t mask, const int64_t *values, uint32_t holds,
                uint8_t queue, int ce) {
    for (int w = 0; w < ps->workers; w++) {
        if (!(mask >> w & 1)) continue;
        header_t h = {ps->job, (uint16_t)(seq & 0xFFFF), (uint8_t)w, (uint8_t)ps->workers,
                      (uint8_t)(F_ACK | (ce ? F_ECN_ECHO : 0)), queue, holds, seq, ps->run};
        ps_send(ps, w, &h, values);
    }
}

static uint32_t random32(void) {
    uint32_t r = 0;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint32_t)(now_s() * 1e9);
    return r;
}

/* Serve for up to `timeout_ms`: every datagram waiting, then wait for more. Per step that
 * completes (a chunk flagged FLAG_END and everything before it), its aggregated and raw
 * packets and seconds into `steps_out` (3 a step, at most `max_steps`). Returns the steps
 * completed, or -1 with `overflow_out` (chunk index, lane, sum) where a sum left int32. */
int64_t agg_ps_poll(ps_t *ps, int timeout_ms, ps_stats *st, double *steps_out, int64_t max_steps,
                    int64_t *overflow_out) {
    static __thread uint8_t rbuf[BATCH][PACKET + 64];
    static __thread uint8_t cbuf[BATCH][64];
    struct mmsghdr rmsg[BATCH];
    struct iovec riov[BATCH];
    int64_t steps = 0;
    memset(rmsg, 0, sizeof rmsg);
    for (int i = 0; i < BATCH; i++) {
        riov[i].iov_base = rbuf[i]; riov[i].iov_len = sizeof rbuf[i];
        rmsg[i].msg_hdr.msg_iov = &riov[i]; rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    double until = now_s() + timeout_ms / 1000.0;
    for (;;) {
        for (int i = 0; i < BATCH; i++) {
            rmsg[i].msg_hdr.msg_control = cbuf[i];
            rmsg[i].msg_hdr.msg_controllen = sizeof cbuf[i];
        }
        int got = recvmmsg(ps->fd, rmsg, BATCH, MSG_DONTWAIT, NULL);
        if (got <= 0) {
            ps_flush(ps);
            if (steps >= max_steps) return steps;
            double left = until - now_s();
            if (left <= 0) return steps;
            struct pollfd pfd = {ps->fd, POLLIN, 0};
            poll(&pfd, 1, (int)(left * 1000.0) + 1);
            if (now_s() >= until && !(pfd.revents & POLLIN)) return steps;
            continue;
        }
        for (int i = 0; i < got; i++) {
            if (rmsg[i].msg_len < PACKET) continue;
            header_t p;
            decode_header(rbuf[i], &p);
            if (p.job != ps->job || (p.flags & F_ACK)) continue;
            int ce = 0;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&rmsg[i].msg_hdr); cm;
                 cm = CMSG_NXTHDR(&rmsg[i].msg_hdr, cm))
                if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_TOS && (CMSG_DATA(cm)[0] & 3) == 3)
                    ce = 1;
            if (p.flags & F_JOIN) {
                int w = p.worker;
                uint32_t nonce = p.seq;
                if (w < ps->workers && nonce && ps->nonces[w] && ps->nonces[w] != nonce) {
                    /* the job started again: a new run, nothing of the old one kept */
                    ps->run = 1 + (uint32_t)(((uint64_t)ps->run + random32() % 0xFFFFFFFEu) % 0xFFFFFFFFu);
                    st->runs++;
                    memset(ps->nonces, 0, sizeof ps->nonces);
                    ps_clear(ps);
                }
                if (w < ps->workers && nonce) ps->nonces[w] = nonce;
                answer_join(ps, w);
                continue;
            }
            if (p.run != ps->run) { st->other_runs++; answer_join(ps, p.worker); continue; }
            int64_t idx = ps->low + signed32((int64_t)p.seq - ps->first_seq - ps->low);
            if (idx < 0) continue;
            uint32_t mask = p.contributors & ps->all_mask;
            int64_t s = idx % ps->retain;
            if (idx < ps->low || (ps->idx[s] == idx && ps->complete[s])) {
                if (ps->idx[s] == idx && ps->complete[s])  /* acknowledged again, with its sum */
                    ack(ps, p.seq, mask, ps->acc + s * LANES, ps->all_mask, p.queue, ce);
                continue;
            }
            if (idx - ps->low >= ps->retain) continue;  /* further ahead than any worker can be */
            if (ps->idx[s] != idx) {  /* open it (a slot's older chunk is long complete) */
                ps->idx[s] = idx; ps->bitmap[s] = 0; ps->complete[s] = 0; ps->end[s] = 0;
                ps->queue[s] = 0; ps->ce[s] = 0;
                memset(ps->acc + s * LANES, 0, sizeof(int64_t) * LANES);
            }
            if (p.queue > ps->queue[s]) ps->queue[s] = p.queue;
            ps->ce[s] |= (uint8_t)ce;
            if ((ps->bitmap[s] & p.contributors) || (p.contributors & ~ps->all_mask)) {
                st->duplicates++;
                if (p.flags & F_RETRANSMIT) ack(ps, p.seq, mask, NULL, ps->bitmap[s], 0, 0);
                continue;
            }
            if (p.flags & F_AGGREGATED) { st->aggregated++; st->step_aggregated++; }
            else { st->raw++; st->step_raw++; }
            if (p.flags & F_END) ps->end[s] = 1;
            ps->bitmap[s] |= p.contributors;
            int64_t *acc = ps->acc + s * LANES;
            for (int l = 0; l < LANES; l++) acc[l] += (int32_t)get32(rbuf[i] + HEADER + 4 * l);
            if (ps->bitmap[s] != ps->all_mask) {
                if (p.flags & F_RETRANSMIT) ack(ps, p.seq, mask, NULL, ps->bitmap[s], 0, 0);
                continue;
            }
            for (int l = 0; l < LANES; l++) {
                if (acc[l] > INT32_MAX || acc[l] < -(int64_t)INT32_MAX) {
                    overflow_out[0] = idx; overflow_out[1] = l; overflow_out[2] = acc[l];
                    ps_flush(ps);
                    return -1;
                }
            }
            ps->complete[s] = 1;
            while (ps->idx[ps->low % ps->retain] == ps->low && ps->complete[ps->low % ps->retain]) {
                int64_t ls = ps->low % ps->retain;
                if (ps->end[ls]) {
                    ps->end[ls] = 0;
                    double t = now_s();
                    if (steps < max_steps) {
                        steps_out[3 * steps] = (double)st->step_aggregated;
                        steps_out[3 * steps + 1] = (double)st->step_raw;
                        steps_out[3 * steps + 2] = t - ps->step_start;
                    }
                    steps++;
                    st->steps++;
                    st->step_aggregated = st->step_raw = 0;
                    ps->step_start = t;
                }
                ps->low++;
            }
            ack(ps, p.seq, ps->all_mask, acc, ps->all_mask, ps->queue[s], ps->ce[s]);
            st->chunks++;
        }
        if (steps >= max_steps) { ps_flush(ps); return steps; }
    }
}
