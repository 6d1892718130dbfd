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
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <math.h>
#include <time.h>

#define LANES 32           /* values a packet that switches sum; chunks are LANES * k */
#define MAX_LANES 8192
#define HEADER 20
#define PACKET (HEADER + 4 * LANES)
#define MAX_PACKET (HEADER + 4 * MAX_LANES)
#define BATCH 64
#define F_AGGREGATED 0x01
#define F_RETRANSMIT 0x02
#define F_ACK 0x04
#define F_ECN_ECHO 0x08
#define F_JOIN 0x10
#define F_END 0x20
#define MAX_WORKERS 32
/* Segmentation offload (Linux 4.18+ sends, 5.0+ receives): a batch of equal datagrams to
 * one address goes down the stack as one (UDP_SEGMENT) and, on a socket that asks
 * (UDP_GRO), comes up as one, the kernel cutting or the receiver splitting it at the same
 * boundaries: the same datagrams on the wire, a fraction of the per-packet work
 * (docs/benchmarks/training.md). A software switch reading a veth with a packet socket
 * (bmv2) would see the batch as one frame, so `gso` 2 sends it only to 127.0.0.0/8. */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#define GSO_SEGMENTS 64    /* UDP_MAX_SEGMENTS before Linux 6.x */
#define GSO_BYTES 65000    /* within an IPv4 datagram's 65,507 */
#define GRO_BYTES 65536    /* the most a coalesced datagram carries */
/* The loops over a packet's values, built twice: for AVX2 (byte swaps and conversions
 * 8 lanes at once) and for any x86-64; the loader picks by the CPU it runs on (a 1M-value
 * bucket's all-reduce about 20 -> 14 ms, docs/benchmarks/training.md). The same
 * IEEE operations either way, so the same numbers, bit for bit. */
#if defined(__x86_64__) && defined(__GNUC__)
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif
/* block floating point (agg_agent/blockfloat.py) */
#define BF_BLOCK 256
#define BF_EXP_MIN (-160)
#define BF_EXP_MAX 128
#define BF_BAND 26
#define BF_BANDS 12
#define BF_HEAD 2
#define BF_INT32_MAX 2147483647LL

int agg_lanes(void) { return LANES; }
int agg_max_lanes(void) { return MAX_LANES; }

/* Batches of datagrams of up to `size` bytes each, reused by a thread's calls. */
typedef struct {
    size_t size;
    uint8_t *buf;          /* BATCH * size */
} batch_t;

static uint8_t *batch(batch_t *b, size_t size) {
    if (b->size < size) {
        uint8_t *p = realloc(b->buf, BATCH * size);
        if (!p) return NULL;
        b->buf = p; b->size = size;
    }
    return b->buf;
}

static int gso_refused;  /* the kernel refused UDP_SEGMENT once: plain datagrams from then */
static int64_t gso_sends, gro_reads;  /* segmented sends made, coalesced messages read */

/* (segmented sends, coalesced messages read, 1 if segmentation was refused) so far. */
void agg_gso_stats(int64_t *out) {
    out[0] = __atomic_load_n(&gso_sends, __ATOMIC_RELAXED);
    out[1] = __atomic_load_n(&gro_reads, __ATOMIC_RELAXED);
    out[2] = gso_refused;
}

/* Datagrams of `packet` bytes to `ip` (network order) one segmented send may carry:
 * `mode` 0 never (1), 1 always, 2 only to loopback addresses. */
static int gso_segments(int mode, uint32_t ip, size_t packet) {
    if (gso_refused || mode <= 0 || (mode == 2 && (ntohl(ip) >> 24) != 127)) return 1;
    size_t n = GSO_BYTES / packet;
    return n > GSO_SEGMENTS ? GSO_SEGMENTS : n < 2 ? 1 : (int)n;
}

static void set_gro(int fd, int on) { setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on); }

/* The size of the datagrams a received message holds (several where they were
 * coalesced: UDP_GRO's control message), or its length. */
static size_t segment_size(const struct msghdr *m, size_t len) {
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm; cm = CMSG_NXTHDR((struct msghdr *)m, cm))
        if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == UDP_GRO) {
            int g;
            memcpy(&g, CMSG_DATA(cm), sizeof g);
            if (g > 0 && (size_t)g < len) {
                __atomic_fetch_add(&gro_reads, 1, __ATOMIC_RELAXED);
                return (size_t)g;
            }
        }
    return len ? len : 1;
}

/* Send `ns` messages, each datagram `per` iovecs. Where the kernel refuses a segmented
 * one (EINVAL or EIO: no UDP segmentation on that route or device; EMSGSIZE: a datagram
 * larger than the route's MTU, which only unsegmented sends may fragment), segmentation is off
 * for the process from then on and the rest go datagram by datagram. Returns 0, or -1
 * with errno. */
static int send_all(int fd, struct mmsghdr *m, int ns, int per) {
    for (int off = 0; off < ns;) {
        int k = sendmmsg(fd, m + off, (unsigned)(ns - off), 0);
        if (k >= 0) { off += k; continue; }
        if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS) continue;
        if (!((errno == EINVAL || errno == EIO || errno == EMSGSIZE)
              && m[off].msg_hdr.msg_controllen))
            return -1;
        gso_refused = 1;
        for (; off < ns; off++) {
            struct msghdr one = m[off].msg_hdr;
            one.msg_control = NULL; one.msg_controllen = 0; one.msg_iovlen = (size_t)per;
            for (size_t j = 0; j < m[off].msg_hdr.msg_iovlen; j += (size_t)per) {
                one.msg_iov = m[off].msg_hdr.msg_iov + j;
                while (sendmsg(fd, &one, 0) < 0)
                    if (errno != EINTR && errno != EAGAIN && errno != ENOBUFS) return -1;
            }
        }
    }
    return 0;
}

/* `m` carrying `n` datagrams of `size` bytes as one segmented send (`cbuf` holds its
 * control message), or as a plain one when `n` is 1. */
static void segmented(struct msghdr *m, int n, size_t size, uint8_t *cbuf) {
    if (n < 2) { m->msg_control = NULL; m->msg_controllen = 0; return; }
    __atomic_fetch_add(&gso_sends, 1, __ATOMIC_RELAXED);
    m->msg_control = cbuf;
    m->msg_controllen = CMSG_SPACE(sizeof(uint16_t));
    struct cmsghdr *cm = CMSG_FIRSTHDR(m);
    cm->cmsg_level = IPPROTO_UDP; cm->cmsg_type = UDP_SEGMENT;
    cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t g = (uint16_t)size;
    memcpy(CMSG_DATA(cm), &g, sizeof g);
}

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

/* Round to nearest, ties to even (numpy's rint) for |v| < 2^51: adding and taking away
 * 1.5 * 2^52 leaves v rounded in the default rounding mode, with no library call. */
static inline double bf_rint(double v) {
    const double m = 6755399441055744.0;
    return (v + m) - m;
}

static int bf_headroom(int workers) {
    int h = 0;
    while ((1 << h) < workers) h++;
    return h;
}

/* Where a chunk's values come from and its sums go: int32 values `q` and int64 sums
 * `sums` (chunks * lanes each), or, with `x` set, block floating point done on the way:
 * the values of a float32 bucket's sent blocks (`sent`, their block numbers; `scale`, each
 * one's), encoded as blockfloat.encode does as the packet is written, and the sums decoded
 * as blockfloat.decode does, divided by `workers`, into float32 `y` as their packet
 * arrives. A chunk is read before it is acknowledged and written after, never again: `y`
 * may be `x` (in place). */
typedef struct {
    const int32_t *q;
    int64_t *sums;
    const float *x;
    float *y;
    int64_t n, nsent;
    const int64_t *sent;
    const double *scale, *inv;
    double workers;
} codec_t;

/* A chunk's lanes cut into runs that lie in one block of the sent blocks' stream: lanes
 * [l, l + len) of the chunk are values [first, first + len) of the bucket, in sent block
 * number b (b < 0: past the stream, padding). */
typedef struct {
    int64_t pos, stop, b, first, len;
    int l;
} run_t;

static run_t first_run(int64_t c, int lanes) {
    run_t r = {c * lanes, c * lanes + lanes, 0, 0, 0, 0};
    return r;
}

static int next_run(const codec_t *k, run_t *r) {
    r->pos += r->len;
    r->l += (int)r->len;
    if (r->pos >= r->stop) return 0;
    if (r->pos >= k->nsent * BF_BLOCK) {
        r->b = -1; r->first = 0; r->len = r->stop - r->pos;
        return 1;
    }
    r->b = r->pos / BF_BLOCK;
    r->len = BF_BLOCK - r->pos % BF_BLOCK;
    if (r->len > r->stop - r->pos) r->len = r->stop - r->pos;
    r->first = k->sent[r->b] * BF_BLOCK + r->pos % BF_BLOCK;
    return 1;
}

/* A chunk's packet: the header, then its `n` values in network order. */
HOT static void put_chunk(uint8_t *p, const header_t *h, const codec_t *k, int64_t c, int n) {
    encode_header(p, h);
    uint32_t *o = (uint32_t *)(p + HEADER);  /* HEADER is a multiple of 4 */
    if (!k->x) {
        const int32_t *v = k->q + c * n;
        for (int l = 0; l < n; l++) o[l] = htonl((uint32_t)v[l]);
        return;
    }
    for (run_t r = first_run(c, n); next_run(k, &r);) {
        /* padding past the stream or the bucket's end: zeros, as blockfloat's */
        int64_t valid = r.b < 0 ? 0 : k->n - r.first;
        if (valid > r.len) valid = r.len;
        if (valid < 0) valid = 0;
        const float *x = k->x + r.first;
        const double s = r.b < 0 ? 0.0 : k->scale[r.b];
        uint32_t *out = o + r.l;
        for (int64_t j = 0; j < valid; j++) {
            double v = (double)x[j];
            double t = v * s;
            t = fabs(v) <= 3.4028234663852886e38 ? t : 0.0;  /* inf, NaN: 0 */
            out[j] = htonl((uint32_t)(int32_t)bf_rint(t));
        }
        for (int64_t j = valid; j < r.len; j++) out[j] = 0;
    }
}

/* A chunk's `n` sums in network order, into `sums` (int64) or decoded into `y`. */
HOT static void get_sums(const codec_t *k, int64_t c, const uint8_t *p, int n) {
    const uint32_t *v = (const uint32_t *)p;
    if (!k->x) {
        int64_t *out = k->sums + c * n;
        for (int l = 0; l < n; l++) out[l] = (int32_t)ntohl(v[l]);
        return;
    }
    for (run_t r = first_run(c, n); next_run(k, &r);) {
        if (r.b < 0) continue;
        int64_t valid = k->n - r.first < r.len ? k->n - r.first : r.len;
        const double inv = k->inv[r.b], w = k->workers;
        float *y = k->y + r.first;
        const uint32_t *in = v + r.l;
        /* decode's (double)sum * 2^-e, then the hook's division and cast */
        for (int64_t j = 0; j < valid; j++)
            y[j] = (float)((double)(int32_t)ntohl(in[j]) * inv / w);
    }
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
    int32_t lanes;         /* values a packet (LANES * k) */
    double timeout_s;
    double deadline_s;     /* < 0: none */
    int64_t max_retries;
    int32_t flight;        /* chunks past the oldest unacknowledged one: <= window */
    int32_t gso;           /* segmented sends: 0 never, 1 always, 2 to loopback only */
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

/* Send `chunks` chunks from index `first` on, their values and sums as `k` says. Returns
 * 0, or -1 with out->fail set. */
static int worker_exchange(const worker_cfg *cfg, int64_t first, const codec_t *k,
                           int64_t chunks, int32_t end, worker_out *out) {
    const uint32_t everyone = cfg->fan_in >= 32 ? 0xFFFFFFFFu : ((1u << cfg->fan_in) - 1);
    uint8_t *acked = calloc((size_t)chunks + 1, 1);
    double *sent_at = malloc(sizeof(double) * ((size_t)chunks + 1));
    double *born = malloc(sizeof(double) * ((size_t)chunks + 1));
    int64_t *tries = calloc((size_t)chunks + 1, sizeof(int64_t));
    int64_t *missing = malloc(sizeof(int64_t) * ((size_t)chunks + 1));
    static __thread batch_t sb, rb;
    const int L = cfg->lanes;
    const size_t packet = HEADER + 4 * (size_t)L, rsize = GRO_BYTES + 64;
    uint8_t *sbase = batch(&sb, packet), *rbase = batch(&rb, rsize);
    struct mmsghdr smsg[BATCH], rmsg[BATCH];
    struct iovec siov[BATCH], riov[BATCH];
    uint8_t scbuf[BATCH][CMSG_SPACE(sizeof(uint16_t))], rcbuf[BATCH][64];
    struct sockaddr_in to = {0};
    int rc = 0;
    const double start = now_s();
    if (L < LANES || L > MAX_LANES || L % LANES) {
        out->fail = 3; out->fail_errno = EINVAL; rc = -1; goto done;
    }
    if (!acked || !sent_at || !born || !tries || !missing || !sbase || !rbase) {
        out->fail = 3; out->fail_errno = ENOMEM; rc = -1; goto done;
    }
    for (int64_t c = 0; c < chunks; c++) { sent_at[c] = -1.0; missing[c] = -1; }
    to.sin_family = AF_INET; to.sin_addr.s_addr = cfg->target_ip; to.sin_port = cfg->target_port;
    memset(smsg, 0, sizeof smsg); memset(rmsg, 0, sizeof rmsg);
    for (int i = 0; i < BATCH; i++) {
        siov[i].iov_base = sbase + i * packet; siov[i].iov_len = packet;
        smsg[i].msg_hdr.msg_iov = &siov[i]; smsg[i].msg_hdr.msg_iovlen = 1;
        smsg[i].msg_hdr.msg_name = &to; smsg[i].msg_hdr.msg_namelen = sizeof to;
        riov[i].iov_base = rbase + i * rsize; riov[i].iov_len = rsize;
        rmsg[i].msg_hdr.msg_iov = &riov[i]; rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    header_t h = {cfg->job, 0, cfg->worker, cfg->fan_in, 0, 0, 1u << cfg->worker, 0, cfg->run};
    int64_t low = 0, nxt = 0;
    set_gro(cfg->fd, 1);  /* off again at the end: the Python code reads datagrams one by one */
    out->fail = 0;
    while (low < chunks) {
        int ns = 0;
        /* new chunks, within the window past the oldest unacknowledged one */
        while (nxt < chunks && nxt < low + cfg->flight && ns < BATCH) {
            int64_t index = first + nxt;
            h.slot = (uint16_t)(index % cfg->window);
            h.seq = (uint32_t)(index & 0xFFFFFFFFLL);
            h.flags = (end && nxt == chunks - 1) ? F_END : 0;
            put_chunk(sbase + ns * packet, &h, k, nxt, L);
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
            put_chunk(sbase + ns * packet, &h, k, c, L);
            sent_at[c] = t;
            out->retrans++; ns++;
        }
        const int seg = gso_segments(cfg->gso, cfg->target_ip, packet);
        int nm = 0;
        for (int i = 0; i < ns; i += seg, nm++) {  /* consecutive datagrams, one send each */
            int n = ns - i < seg ? ns - i : seg;
            smsg[nm].msg_hdr.msg_iov = &siov[i];
            smsg[nm].msg_hdr.msg_iovlen = (size_t)n;
            segmented(&smsg[nm].msg_hdr, n, packet, scbuf[nm]);
        }
        if (send_all(cfg->fd, smsg, nm, 1) < 0) {
            out->fail = 3; out->fail_errno = errno; rc = -1; goto done;
        }
        out->packets += ns;
        /* wait for acknowledgements until the oldest in-flight chunk's timer fires */
        double oldest = 1e300;
        for (int64_t c = low; c < nxt; c++)
            if (!acked[c] && sent_at[c] >= 0 && sent_at[c] < oldest) oldest = sent_at[c];
        double wait = oldest + cfg->timeout_s - now_s();
        if (nxt < chunks && nxt < low + cfg->flight) wait = 0;  /* room to send more */
        struct pollfd pfd = {cfg->fd, POLLIN, 0};
        int ms = wait <= 0 ? 0 : (int)(wait * 1000.0) + 1;
        int pr = poll(&pfd, 1, ms);
        if (pr < 0 && errno != EINTR) { out->fail = 3; out->fail_errno = errno; rc = -1; goto done; }
        if (pr <= 0) continue;
        for (int i = 0; i < BATCH; i++) {
            rmsg[i].msg_hdr.msg_control = rcbuf[i];
            rmsg[i].msg_hdr.msg_controllen = sizeof rcbuf[i];
        }
        int got = recvmmsg(cfg->fd, rmsg, BATCH, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            out->fail = 3; out->fail_errno = errno; rc = -1; goto done;
        }
        for (int i = 0; i < got; i++) {
            const size_t seg = segment_size(&rmsg[i].msg_hdr, rmsg[i].msg_len);
            for (size_t off = 0; off < rmsg[i].msg_len; off += seg) {  /* each datagram */
                const uint8_t *r = rbase + i * rsize + off;
                const size_t len = rmsg[i].msg_len - off < seg ? rmsg[i].msg_len - off : seg;
                if (len < PACKET) continue;
                header_t a;
                decode_header(r, &a);
                if (!(a.flags & F_ACK) || a.job != cfg->job) continue;
                if ((a.flags & F_JOIN) && a.run != cfg->run) {
                    out->fail = 2; out->reset_run = a.run; rc = -1; goto done;
                }
                if (a.flags & F_JOIN || a.run != cfg->run) continue;
                int64_t c = (int64_t)(((uint64_t)a.seq - (uint64_t)first) & 0xFFFFFFFFULL);
                if (c >= chunks || acked[c]) continue;
                if (a.contributors != everyone) { missing[c] = a.contributors; continue; }
                if (len != packet) continue;  /* a sum of other chunks than ours */
                acked[c] = 1;
                get_sums(k, c, r + HEADER, L);
                if (sent_at[c] >= 0 && tries[c] == 0) {  /* Karn: first transmissions only */
                    double rtt = now_s() - sent_at[c];
                    out->srtt = out->srtt < 0 ? rtt : 0.875 * out->srtt + 0.125 * rtt;
                }
                sent_at[c] = -1.0;
                out->queue_counts[a.queue]++;
                while (low < chunks && acked[low]) low++;
            }
        }
    }
done:
    set_gro(cfg->fd, 0);
    out->seconds = now_s() - start;
    free(acked); free(sent_at); free(born); free(tries); free(missing);
    return rc;
}

/* Send `chunks` chunks of `q` (chunks * lanes int32) from index `first` on; every worker's
 * sum into `sums` (chunks * lanes int64). Returns 0, or -1 with out->fail set. */
int agg_worker_exchange(const worker_cfg *cfg, int64_t first, const int32_t *q, int64_t chunks,
                        int32_t end, int64_t *sums, worker_out *out) {
    codec_t k = {0};
    k.q = q; k.sums = sums;
    return worker_exchange(cfg, first, &k, chunks, end, out);
}

/* The values of a float32 bucket `x` (n values) in block floating point, agreed at `tops`
 * (`none`: a block zero on every rank, not sent), from index `first` on; the sum over
 * `workers` ranks divided by `workers` into `y` (may be `x`): blockfloat.encode, the
 * exchange, blockfloat.decode and the hook's mean, in one pass as packets go and come.
 * Returns 0, or -1 with out->fail set. */
int agg_worker_exchange_bf(const worker_cfg *cfg, int64_t first, const float *x, int64_t n,
                           const int64_t *tops, int64_t none, int workers, float *y,
                           int32_t end, worker_out *out) {
    int64_t nb = (n + BF_BLOCK - 1) / BF_BLOCK, nsent = 0;
    int h = bf_headroom(workers);
    int64_t *sent = malloc(sizeof(int64_t) * (size_t)(nb + 1));
    double *scale = malloc(sizeof(double) * (size_t)(nb + 1));
    double *inv = malloc(sizeof(double) * (size_t)(nb + 1));
    int rc = -1;
    if (!sent || !scale || !inv) { out->fail = 3; out->fail_errno = ENOMEM; goto done; }
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * BF_BLOCK, hi = lo + BF_BLOCK < n ? lo + BF_BLOCK : n;
        if (tops[b] == none) {  /* zero on every rank: its sum is zero */
            memset(y + lo, 0, sizeof(float) * (size_t)(hi - lo));
            continue;
        }
        sent[nsent] = b;
        scale[nsent] = ldexp(1.0, (int)(30 - h - tops[b]));
        inv[nsent++] = ldexp(1.0, (int)(tops[b] + h - 30));
    }
    codec_t k = {0};
    k.x = x; k.y = y; k.n = n; k.nsent = nsent; k.sent = sent; k.scale = scale; k.inv = inv;
    k.workers = (double)workers;
    int64_t chunks = (nsent * BF_BLOCK + cfg->lanes - 1) / cfg->lanes;
    rc = worker_exchange(cfg, first, &k, chunks, end, out);
done:
    free(sent); free(scale); free(inv);
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
    int32_t lanes;             /* values a packet (LANES * k) */
    int64_t low;               /* the oldest index not complete */
    uint32_t nonces[MAX_WORKERS];
    /* per ring slot (index mod retain) */
    int64_t *idx;              /* the index it holds, -1: none */
    uint32_t *bitmap;
    uint8_t *complete, *end, *queue, *ce;
    int64_t *acc;              /* lanes a slot */
    double step_start;
    /* outgoing batch: every packet is a header and a payload; a chunk's sums are put in
       network order once, in one of BATCH payloads, which each worker's packet shares */
    struct mmsghdr smsg[BATCH];
    struct iovec siov[BATCH][2];
    uint8_t shead[BATCH][HEADER];
    uint8_t *sbuf;             /* BATCH payloads of `lanes` values */
    int ns, np;
    int64_t other_sizes;       /* packets with another number of values: dropped */
    int gso;                   /* as worker_cfg's */
    /* what ps_flush sends: each worker's packets of one size, segmented where allowed */
    struct mmsghdr gmsg[BATCH];
    struct iovec giov[2 * BATCH];
    uint8_t gcbuf[BATCH][CMSG_SPACE(sizeof(uint16_t))];
} ps_t;

void agg_ps_free(ps_t *ps) {
    if (!ps) return;
    set_gro(ps->fd, 0);
    free(ps->idx); free(ps->bitmap); free(ps->complete); free(ps->end); free(ps->queue);
    free(ps->ce); free(ps->acc); free(ps->sbuf); free(ps);
}

static void ps_clear(ps_t *ps) {
    for (int64_t i = 0; i < ps->retain; i++) ps->idx[i] = -1;
    ps->low = 0;
}

ps_t *agg_ps_new(int fd, uint16_t job, int workers, const uint32_t *ips, const uint16_t *ports,
                 uint32_t run, uint32_t first_seq, int64_t retain, int32_t lanes) {
    if (workers < 1 || workers > MAX_WORKERS || retain < 1) return NULL;
    if (lanes < LANES || lanes > MAX_LANES || lanes % LANES) return NULL;
    ps_t *ps = calloc(1, sizeof *ps);
    if (!ps) return NULL;
    ps->fd = fd; ps->job = job; ps->workers = workers;
    ps->all_mask = workers >= 32 ? 0xFFFFFFFFu : ((1u << workers) - 1);
    ps->run = run; ps->first_seq = first_seq; ps->retain = retain; ps->lanes = lanes;
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
    ps->acc = calloc((size_t)retain * (size_t)lanes, sizeof(int64_t));
    ps->sbuf = malloc(BATCH * 4 * (size_t)lanes);
    if (!ps->idx || !ps->bitmap || !ps->complete || !ps->end || !ps->queue || !ps->ce || !ps->acc
        || !ps->sbuf) {
        agg_ps_free(ps);
        return NULL;
    }
    ps_clear(ps);
    for (int i = 0; i < BATCH; i++) {
        ps->siov[i][0].iov_base = ps->shead[i]; ps->siov[i][0].iov_len = HEADER;
        ps->smsg[i].msg_hdr.msg_iov = ps->siov[i]; ps->smsg[i].msg_hdr.msg_iovlen = 2;
        ps->smsg[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
    }
    ps->step_start = now_s();
    ps->gso = 2;
    set_gro(fd, 1);  /* only the C loop reads this socket while it serves */
    return ps;
}

void agg_ps_set_gso(ps_t *ps, int mode) { ps->gso = mode; }

uint32_t agg_ps_run(const ps_t *ps) { return ps->run; }
int64_t agg_ps_other_sizes(const ps_t *ps) { return ps->other_sizes; }

/* The workers' addresses changed (the Python server reads them at every send). */
void agg_ps_set_workers(ps_t *ps, const uint32_t *ips, const uint16_t *ports) {
    for (int w = 0; w < ps->workers; w++) {
        ps->addrs[w].sin_addr.s_addr = ips[w];
        ps->addrs[w].sin_port = ports[w];
    }
}

/* The batch's packets, each worker's in their order, consecutive ones of one size as one
 * segmented send where `gso` allows. */
static void ps_flush(ps_t *ps) {
    int nm = 0, nv = 0;
    for (int w = 0; w < ps->workers; w++) {
        int n = 0, limit = 1;
        size_t size = 0;
        for (int i = 0; i <= ps->ns; i++) {
            size_t len = 0;
            if (i < ps->ns) {
                if (ps->smsg[i].msg_hdr.msg_name != &ps->addrs[w]) continue;
                len = HEADER + ps->siov[i][1].iov_len;
            }
            if (n && (i == ps->ns || len != size || n == limit)) {  /* close the message */
                ps->gmsg[nm].msg_hdr.msg_iovlen = 2 * (size_t)n;
                segmented(&ps->gmsg[nm].msg_hdr, n, size, ps->gcbuf[nm]);
                nm++; n = 0;
            }
            if (i == ps->ns) break;
            if (!n) {
                struct msghdr *m = &ps->gmsg[nm].msg_hdr;
                m->msg_name = &ps->addrs[w]; m->msg_namelen = sizeof ps->addrs[w];
                m->msg_iov = &ps->giov[nv];
                size = len;
                limit = gso_segments(ps->gso, ps->addrs[w].sin_addr.s_addr, len);
            }
            ps->giov[nv++] = ps->siov[i][0];
            ps->giov[nv++] = ps->siov[i][1];
            n++;
        }
    }
    /* errors as sendto's are for the Python server: the sender retransmits */
    send_all(ps->fd, ps->gmsg, nm, 2);
    ps->ns = ps->np = 0;
}

/* A chunk's sums in network order (each within int32: checked first). */
HOT static void put_values(uint32_t *o, const int64_t *values, int n) {
    for (int l = 0; l < n; l++) o[l] = htonl((uint32_t)values[l]);
}

/* A packet's values added to a chunk's sums. */
HOT static void add_values(int64_t *acc, const uint32_t *v, int n) {
    for (int l = 0; l < n; l++) acc[l] += (int32_t)ntohl(v[l]);
}

/* The first lane whose sum left int32, or -1. */
HOT static int overflowed(const int64_t *acc, int n) {
    int64_t lo = 0, hi = 0;
    for (int l = 0; l < n; l++) {  /* branch-free first, to vectorize; the lane only if needed */
        lo = acc[l] < lo ? acc[l] : lo;
        hi = acc[l] > hi ? acc[l] : hi;
    }
    if (hi <= INT32_MAX && lo >= -(int64_t)INT32_MAX) return -1;
    for (int l = 0; l < n; l++)
        if (acc[l] > INT32_MAX || acc[l] < -(int64_t)INT32_MAX) return l;
    return -1;
}

static const uint32_t zeros[LANES];  /* a status's or a join's answer: LANES zeros */

/* A payload for the next packets: `values` (the chunk's `lanes` sums) in network order, or
 * (values NULL) LANES zeros, as the Python server's. */
static void ps_payload(ps_t *ps, const int64_t *values, const void **base, size_t *len) {
    if (!values) { *base = zeros; *len = sizeof zeros; return; }
    if (ps->np == BATCH || ps->ns + ps->workers > BATCH) ps_flush(ps);
    uint32_t *o = (uint32_t *)(ps->sbuf + (size_t)ps->np++ * 4 * (size_t)ps->lanes);
    put_values(o, values, ps->lanes);
    *base = o; *len = 4 * (size_t)ps->lanes;
}

/* A packet to worker `w`: its header and a payload of `ps_payload`. */
static void ps_send(ps_t *ps, int w, const header_t *h, const void *base, size_t len) {
    if (ps->ns == BATCH) ps_flush(ps);  /* a payload of zeros outlives a flush; sums do not */
    encode_header(ps->shead[ps->ns], h);
    ps->siov[ps->ns][1].iov_base = (void *)base;
    ps->siov[ps->ns][1].iov_len = len;
    ps->smsg[ps->ns].msg_hdr.msg_name = &ps->addrs[w];
    ps->ns++;
}

static void answer_join(ps_t *ps, int w) {
    if (w < 0 || w >= ps->workers) return;
    header_t h = {ps->job, 0, (uint8_t)w, (uint8_t)ps->workers, F_ACK | F_JOIN, 0, ps->all_mask, 0, ps->run};
    ps_send(ps, w, &h, zeros, sizeof zeros);
}

static void ack(ps_t *ps, uint32_t seq, uint32_t mask, const int64_t *values, uint32_t holds,
                uint8_t queue, int ce) {
    const void *base;
    size_t len;
    ps_payload(ps, values, &base, &len);  /* flushes first if the batch could not hold all */
    for (int w = 0; w < ps->workers; w++) {
        if (!(mask >> w & 1)) continue;
        header_t h = {ps->job, (uint16_t)(seq & 0xFFFF), (uint8_t)w, (uint8_t)ps->workers,
                      (uint8_t)(F_ACK | (ce ? F_ECN_ECHO : 0)), queue, holds, seq, ps->run};
        ps_send(ps, w, &h, base, len);
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
    static __thread batch_t rb;
    static __thread uint8_t cbuf[BATCH][64];
    const int L = ps->lanes;
    const size_t packet = HEADER + 4 * (size_t)L, rsize = GRO_BYTES + 64;
    uint8_t *rbase = batch(&rb, rsize);  /* any size, to count the ones of another */
    if (!rbase) return -2;
    struct mmsghdr rmsg[BATCH];
    struct iovec riov[BATCH];
    int64_t steps = 0;
    memset(rmsg, 0, sizeof rmsg);
    for (int i = 0; i < BATCH; i++) {
        riov[i].iov_base = rbase + i * rsize; riov[i].iov_len = rsize;
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
            int ce = 0;
            for (struct cmsghdr *cm = CMSG_FIRSTHDR(&rmsg[i].msg_hdr); cm;
                   cm = CMSG_NXTHDR(&rmsg[i].msg_hdr, cm))
                  if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_TOS && (CMSG_DATA(cm)[0] & 3) == 3)
                      ce = 1;
            const size_t seg = segment_size(&rmsg[i].msg_hdr, rmsg[i].msg_len);
            for (size_t off = 0; off < rmsg[i].msg_len; off += seg) {  /* each datagram */
                const uint8_t *r = rbase + i * rsize + off;
                const size_t len = rmsg[i].msg_len - off < seg ? rmsg[i].msg_len - off : seg;
                if (len < PACKET) continue;
                header_t p;
                decode_header(r, &p);
                if (p.job != ps->job || (p.flags & F_ACK)) continue;
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
                if (len != packet) { ps->other_sizes++; continue; }
                int64_t idx = ps->low + signed32((int64_t)p.seq - ps->first_seq - ps->low);
                if (idx < 0) continue;
                uint32_t mask = p.contributors & ps->all_mask;
                int64_t s = idx % ps->retain;
                if (idx < ps->low || (ps->idx[s] == idx && ps->complete[s])) {
                    if (ps->idx[s] == idx && ps->complete[s])  /* acknowledged again, with its sum */
                        ack(ps, p.seq, mask, ps->acc + s * L, ps->all_mask, p.queue, ce);
                    continue;
                }
                if (idx - ps->low >= ps->retain) continue;  /* further ahead than any worker can be */
                if (ps->idx[s] != idx) {  /* open it (a slot's older chunk is long complete) */
                    ps->idx[s] = idx; ps->bitmap[s] = 0; ps->complete[s] = 0; ps->end[s] = 0;
                    ps->queue[s] = 0; ps->ce[s] = 0;
                    memset(ps->acc + s * L, 0, sizeof(int64_t) * (size_t)L);
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
                int64_t *acc = ps->acc + s * L;
                const uint32_t *v = (const uint32_t *)(r + HEADER);
                add_values(acc, v, L);
                if (ps->bitmap[s] != ps->all_mask) {
                    if (p.flags & F_RETRANSMIT) ack(ps, p.seq, mask, NULL, ps->bitmap[s], 0, 0);
                    continue;
                }
                int bad = overflowed(acc, L);
                if (bad >= 0) {
                    overflow_out[0] = idx; overflow_out[1] = bad; overflow_out[2] = acc[bad];
                    ps_flush(ps);
                    return -1;
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
        }
        if (steps >= max_steps) { ps_flush(ps); return steps; }
    }
}

/* ------------------------------------------------- block floating point (blockfloat.py) -- */
/* The hook's conversions, as agg_agent/blockfloat.py's `agreement`, `encode` and `decode`
 * compute them (the reference; tests/agent/test_blockfloat.py requires identical output). */


int agg_bf_layout(int32_t *out) {  /* the constants, checked against the Python module's */
    out[0] = BF_BLOCK; out[1] = BF_EXP_MIN; out[2] = BF_EXP_MAX; out[3] = BF_BAND;
    out[4] = BF_BANDS; out[5] = BF_HEAD;
    return 6;
}

/* This rank's agreement lanes on `x` (n values) into `out` (BF_HEAD + BF_BANDS a block,
 * zeroed by the caller). */
HOT static void bf_agreement(const double *xd, const float *xf, int64_t n, int32_t *out) {
    int64_t nonfinite = 0, nb = (n + BF_BLOCK - 1) / BF_BLOCK;
    int refused = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * BF_BLOCK, hi = lo + BF_BLOCK < n ? lo + BF_BLOCK : n;
        double top = 0.0;
        for (int64_t i = lo; i < hi; i++) {
            double a = fabs(xf ? (double)xf[i] : xd[i]);  /* float32 to double: exact */
            if (!isfinite(a)) { nonfinite++; continue; }
            if (a > top) top = a;
        }
        if (top == 0.0) continue;
        int e;
        frexp(top, &e);
        if (e > BF_EXP_MAX) { refused = 1; continue; }
        int k = (e < BF_EXP_MIN ? BF_EXP_MIN : e) - BF_EXP_MIN;
        out[BF_HEAD + b * BF_BANDS + k / BF_BAND] = (int32_t)(1 << (k % BF_BAND));
    }
    out[0] = (int32_t)(nonfinite < BF_INT32_MAX / 32 ? nonfinite : BF_INT32_MAX / 32);
    if (refused) {  /* as the reference: only the two head lanes */
        memset(out + BF_HEAD, 0, sizeof(int32_t) * (size_t)(nb * BF_BANDS));
        out[1] = 1;
    }
}

void agg_bf_agreement(const double *x, int64_t n, int32_t *out) { bf_agreement(x, NULL, n, out); }

/* The same, of float32 values. */
void agg_bf_agreement32(const float *x, int64_t n, int32_t *out) { bf_agreement(NULL, x, n, out); }

/* The int32 lanes of `x`'s sent blocks (tops[b] != none), each at its scale; returns how
 * many were written into `out`. */
int64_t agg_bf_encode(const double *x, int64_t n, const int64_t *tops, int64_t none, int workers,
                      int32_t *out) {
    int64_t nb = (n + BF_BLOCK - 1) / BF_BLOCK, w = 0;
    int h = bf_headroom(workers);
    for (int64_t b = 0; b < nb; b++) {
        if (tops[b] == none) continue;
        double scale = ldexp(1.0, (int)(30 - h - tops[b]));
        int64_t lo = b * BF_BLOCK;
        for (int64_t i = 0; i < BF_BLOCK; i++) {
            double v = lo + i < n ? x[lo + i] : 0.0;
            out[w++] = isfinite(v) ? (int32_t)bf_rint(v * scale) : 0;  /* |v * scale| <= 2^30 */
        }
    }
    return w;
}

/* The bucket's sum (n values) from the summed lanes of its sent blocks; zero elsewhere. */
void agg_bf_decode(const int64_t *sums, const int64_t *tops, int64_t none, int64_t n, int workers,
                   double *out) {
    int64_t nb = (n + BF_BLOCK - 1) / BF_BLOCK, r = 0;
    int h = bf_headroom(workers);
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * BF_BLOCK, hi = lo + BF_BLOCK < n ? lo + BF_BLOCK : n;
        if (tops[b] == none) {
            memset(out + lo, 0, sizeof(double) * (size_t)(hi - lo));
            continue;
        }
        /* a power of two: multiplying by its inverse is the reference's division, exactly */
        double inv = ldexp(1.0, (int)(tops[b] + h - 30));
        for (int64_t i = lo; i < hi; i++) out[i] = (double)sums[r + i - lo] * inv;
        r += BF_BLOCK;
    }
}
