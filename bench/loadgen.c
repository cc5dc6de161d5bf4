/*
 * loadgen — target-agnostic WebSocket fan-out load generator for Herald
 * (and peers such as nginx + Nchan).  See bench/README.md for the flags.
 *
 * Process layout
 *   parent      parses flags, forks workers, drives the phases, aggregates
 *               results that arrive through pipes, prints them.
 *   sub worker  (one per --conns-per-proc connections, each bound to its own
 *               source address 127.0.0.<src-base + i>): opens the WebSocket
 *               subscribers, parses deliveries, keeps latency histograms,
 *               duplicate bitmaps, and drives the dismiss / reconnect phases.
 *   pub worker  (--pub-procs of them): open-loop HTTP/1.1 keep-alive publisher
 *               at a fixed rate, each request on one of --pub-conns connections,
 *               one request in flight per connection (no pipelining).
 *
 * Message numbering: message n goes to user (n % users); a subscriber of
 * user u expects every n with n % users == u, exactly once per device.
 * Each payload carries {ts} = the intended publish time (CLOCK_MONOTONIC ns,
 * open-loop schedule, so publisher queueing counts as latency) and {n}.
 *
 * TLS: wss:// and https:// URLs use OpenSSL on the same non-blocking
 * sockets and epoll loops (io_recv / io_send / io_handshake below).
 *
 * Every loop is bounded in count and time; all traffic goes to the URLs
 * given, which must be numeric IPv4 addresses (loopback in this project).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

/* ------------------------------------------------------------------ */
/* utilities                                                           */
/* ------------------------------------------------------------------ */

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *g_role = "loadgen";

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", g_role);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static void *xcalloc(size_t a, size_t b) {
    void *p = calloc(a ? a : 1, b ? b : 1);
    if (!p) die("out of memory");
    return p;
}
static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

static void write_full(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            _exit(3); /* parent gone */
        }
        p += w;
        len -= (size_t)w;
    }
}

/* read exactly len bytes before deadline (monotonic ns); 0 ok, -1 eof/timeout */
static int read_full_deadline(int fd, void *buf, size_t len, uint64_t deadline) {
    char *p = buf;
    while (len) {
        uint64_t now = now_ns();
        if (now >= deadline) return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ms = (int)((deadline - now) / 1000000ull) + 1;
        int r = poll(&pfd, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static void set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* growable byte buffer */
typedef struct {
    char *p;
    size_t len, cap;
} buf_t;

static void buf_reserve(buf_t *b, size_t extra) {
    if (b->len + extra <= b->cap) return;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + extra) nc *= 2;
    b->p = xrealloc(b->p, nc);
    b->cap = nc;
}
static void buf_add(buf_t *b, const void *d, size_t n) {
    buf_reserve(b, n + 1);
    memcpy(b->p + b->len, d, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void buf_adds(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }
static void buf_addf(buf_t *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        buf_add(b, tmp, (size_t)n);
        return;
    }
    buf_reserve(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}
static void buf_free(buf_t *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ------------------------------------------------------------------ */
/* HDR-style log-linear histogram (ns), ~1.6% worst-case bucket width   */
/* ------------------------------------------------------------------ */

#define H_LEN 2624 /* values up to 2^46 ns (~19.5 h) */
typedef struct {
    uint64_t c[H_LEN];
    uint64_t n, max, min, sum;
} hist_t;

static int h_idx(uint64_t v) {
    if (v >= (1ull << 46)) v = (1ull << 46) - 1;
    if (v < 128) return (int)v;
    int e = 63 - __builtin_clzll(v);
    int b = e - 6;
    return b * 64 + (int)(v >> b);
}
static uint64_t h_high(int idx) { /* highest value in bucket */
    if (idx < 128) return (uint64_t)idx;
    int b = idx / 64 - 1;
    uint64_t sub = (uint64_t)(idx - b * 64);
    return ((sub + 1) << b) - 1;
}
static void h_add(hist_t *h, uint64_t v) {
    h->c[h_idx(v)]++;
    if (h->n == 0 || v < h->min) h->min = v;
    if (v > h->max) h->max = v;
    h->n++;
    h->sum += v;
}
static void h_merge(hist_t *a, const hist_t *b) {
    if (!b->n) return;
    for (int i = 0; i < H_LEN; i++) a->c[i] += b->c[i];
    if (a->n == 0 || b->min < a->min) a->min = b->min;
    if (b->max > a->max) a->max = b->max;
    a->n += b->n;
    a->sum += b->sum;
}
static uint64_t h_pct(const hist_t *h, double q) {
    if (!h->n) return 0;
    uint64_t target = (uint64_t)ceil(q * (double)h->n);
    if (target < 1) target = 1;
    uint64_t cum = 0;
    for (int i = 0; i < H_LEN; i++) {
        cum += h->c[i];
        if (cum >= target) {
            uint64_t v = h_high(i);
            return v > h->max ? h->max : v;
        }
    }
    return h->max;
}
static double ms(uint64_t ns) { return (double)ns / 1e6; }

/* ------------------------------------------------------------------ */
/* options                                                             */
/* ------------------------------------------------------------------ */

#define MAX_HDRS 16
#define MAX_STEPS 64
#define MAX_PIDS 64
#define MAX_SUB_URLS 16

enum { TS_HYBRID = 0, TS_INTENDED, TS_ACTUAL };
typedef enum { M_FANOUT, M_IDLE, M_DISMISS, M_RECONNECT } mode_t_;

static struct {
    mode_t_ mode;
    long users, devices, conns; /* conns = users*devices */
    char *sub_urls[MAX_SUB_URLS]; /* ws://ip:port/path-template; connection k uses k mod n */
    int n_sub_urls;
    int url_by_user; /* --url-by user: all devices of user u on URL u mod n */
    int keep_going;  /* run every step of a multi-step run, whatever the last one did */
    char *hello;                /* optional first text frame template */
    char *resume_hello;         /* reconnect: hello with {cursor}/{epoch} */
    char *ready_match;          /* substring that marks a subscriber ready */
    char *sub_headers[MAX_HDRS];
    int n_sub_headers;
    char *pub_urls[MAX_SUB_URLS]; /* http://ip:port/path-template; publisher connection k uses k mod n */
    int n_pub_urls;
    char *pub_method;
    char *pub_headers[MAX_HDRS];
    int n_pub_headers;
    char *pub_body;
    char *ts_key, *n_key;  /* keys of the timestamp and number in deliveries */
    char *msg_filter;      /* only frames containing this are scanned */
    char *id_key;          /* dismiss: key of the notification id */
    char *dismiss_frame;   /* dismiss: frame sent by device 0 */
    char *dismiss_match;   /* dismiss: substring of the resulting change */
    char *user_prefix, *device_prefix;
    char *app, *key, *secret;
    long token_ttl;
    double rates[MAX_STEPS];
    int n_rates;
    double duration;      /* s per step */
    double drain;         /* s after a step's last publish */
    double max_p99_ms;    /* ramp stop criterion */
    long burst;           /* reconnect: publishes per user while away */
    long conns_per_proc;
    int src_base;         /* 127.0.0.<src_base + worker> */
    int connect_conc;     /* per worker, handshakes in flight */
    double setup_timeout; /* s */
    double hold;          /* idle: s to hold after ready */
    double settle;        /* idle: s to wait before sampling RSS */
    const char *around_steps; /* fanout: shell command run with "start" before the steps, "stop" after */
    int pub_conns, pub_procs;
    int ts_mode;          /* TS_HYBRID, TS_INTENDED, TS_ACTUAL */
    int server_pids[MAX_PIDS];
    int n_server_pids;
    double max_run; /* hard bound on the whole run, s */
    int quiet;
    char *ca; /* verify TLS servers against this PEM file; none: no verification */
} O;

/* parsed URLs */
typedef struct {
    struct sockaddr_in addr;
    char hostport[64];
    char *path; /* template */
    int tls;    /* wss:// or https:// */
} url_t;
static url_t SUB_URLS[MAX_SUB_URLS], PUB_URLS[MAX_SUB_URLS];
/* several --sub-url (several gateway nodes): connection uidx*devices+didx
   goes to URL number (that) mod n, so with n = devices, device d of every
   user is on URL d, and with one device per user, users alternate;
   --url-by user: every device of user u on URL u mod n */
#define SC_URL(c) \
    (&SUB_URLS[(O.url_by_user ? (c)->uidx : (c)->uidx * O.devices + (c)->didx) % O.n_sub_urls])

static void parse_url(const char *s, url_t *u, int ws) {
    const char *p = s;
    const char *scheme = ws ? "ws" : "http";
    size_t sl = strlen(scheme);
    if (strncmp(p, scheme, sl) != 0) die("URL must start with %s:// or %ss://: %s", scheme, scheme, s);
    p += sl;
    u->tls = *p == 's';
    p += u->tls;
    if (strncmp(p, "://", 3) != 0) die("URL must start with %s:// or %ss://: %s", scheme, scheme, s);
    p += 3;
    const char *slash = strchr(p, '/');
    if (!slash) slash = p + strlen(p);
    char hp[64];
    size_t hl = (size_t)(slash - p);
    if (hl == 0 || hl >= sizeof hp) die("bad host in URL %s", s);
    memcpy(hp, p, hl);
    hp[hl] = 0;
    snprintf(u->hostport, sizeof u->hostport, "%s", hp);
    char *colon = strrchr(hp, ':');
    int port = u->tls ? 443 : 80;
    if (colon) {
        *colon = 0;
        port = atoi(colon + 1);
    }
    memset(&u->addr, 0, sizeof u->addr);
    u->addr.sin_family = AF_INET;
    u->addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, hp, &u->addr.sin_addr) != 1) die("URL host must be a numeric IPv4 address: %s", s);
    uint32_t a = ntohl(u->addr.sin_addr.s_addr);
    if ((a >> 24) != 127) die("refusing non-loopback target %s", s);
    u->path = strdup(*slash ? slash : "/");
}

/* ------------------------------------------------------------------ */
/* socket I/O, plain or TLS                                            */
/* ------------------------------------------------------------------ */

static SSL_CTX *g_tls; /* made when a URL is wss:// or https:// */

static void tls_init(void) {
    g_tls = SSL_CTX_new(TLS_client_method());
    if (!g_tls) die("SSL_CTX_new failed");
    /* like send(): a write may be taken in part, and is retried from a buffer
       that may have grown (and moved) since */
    SSL_CTX_set_mode(g_tls, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* a server closing without close_notify ends the stream like a plain FIN */
    SSL_CTX_set_options(g_tls, SSL_OP_IGNORE_UNEXPECTED_EOF);
    if (O.ca) {
        if (SSL_CTX_load_verify_locations(g_tls, O.ca, NULL) != 1) die("cannot load --ca %s", O.ca);
        SSL_CTX_set_verify(g_tls, SSL_VERIFY_PEER, NULL);
    }
}

/* a client session on a connected socket; no session is ever reused, so each
   connection makes a full handshake, like a device's first connect */
static SSL *tls_new(int fd, const url_t *u) {
    SSL *ssl = SSL_new(g_tls);
    if (!ssl) die("SSL_new failed");
    SSL_set_fd(ssl, fd);
    SSL_set_connect_state(ssl);
    if (O.ca) X509_VERIFY_PARAM_set1_ip(SSL_get0_param(ssl), (const unsigned char *)&u->addr.sin_addr, 4);
    return ssl;
}

enum { IO_AGAIN = -1, IO_ERR = -2 };
static char io_why[200]; /* what the last IO_ERR was */

/* an SSL call's failure: IO_AGAIN (*want_out set when it waits for the socket
   to be writable), 0 at the end of the stream, or IO_ERR */
static int tls_result(SSL *ssl, int r, const char *what, int *want_out) {
    int e = SSL_get_error(ssl, r);
    if (want_out) *want_out = e == SSL_ERROR_WANT_WRITE;
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return IO_AGAIN;
    if (e == SSL_ERROR_ZERO_RETURN) return 0;
    unsigned long err = ERR_get_error();
    if (err) {
        char tmp[160];
        ERR_error_string_n(err, tmp, sizeof tmp);
        snprintf(io_why, sizeof io_why, "%s: %s", what, tmp);
    } else snprintf(io_why, sizeof io_why, "%s: %s", what, errno ? strerror(errno) : "connection closed");
    return IO_ERR;
}

/* one read or write that never blocks: bytes moved, 0 at the end of the
   stream (reads only), IO_AGAIN when the socket must be waited for, IO_ERR.
   The error queue is cleared first so SSL_get_error sees only this call. */
static ssize_t io_recv(int fd, SSL *ssl, void *p, size_t n) {
    if (ssl) {
        ERR_clear_error();
        int r = SSL_read(ssl, p, (int)n);
        return r > 0 ? r : tls_result(ssl, r, "TLS read", NULL);
    }
    ssize_t r = recv(fd, p, n, 0);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EINTR) return IO_AGAIN;
    snprintf(io_why, sizeof io_why, "recv: %s", strerror(errno));
    return IO_ERR;
}
static ssize_t io_send(int fd, SSL *ssl, const void *p, size_t n) {
    if (ssl) {
        ERR_clear_error();
        int r = SSL_write(ssl, p, (int)n);
        if (r > 0) return r;
        r = tls_result(ssl, r, "TLS write", NULL);
        if (r == 0) snprintf(io_why, sizeof io_why, "TLS write: connection closed by server");
        return r == 0 ? IO_ERR : r;
    }
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r >= 0) return r;
    if (errno == EAGAIN || errno == EINTR) return IO_AGAIN;
    snprintf(io_why, sizeof io_why, "send: %s", strerror(errno));
    return IO_ERR;
}

/* advance a handshake: 1 when done, IO_AGAIN (*want_out as above), IO_ERR */
static int io_handshake(SSL *ssl, int *want_out) {
    ERR_clear_error();
    int r = SSL_do_handshake(ssl);
    if (r == 1) return 1;
    r = tls_result(ssl, r, "TLS handshake", want_out);
    long v = SSL_get_verify_result(ssl);
    if (r != IO_AGAIN && v != X509_V_OK)
        snprintf(io_why, sizeof io_why, "TLS handshake: certificate: %s", X509_verify_cert_error_string(v));
    else if (r == 0) snprintf(io_why, sizeof io_why, "TLS handshake: connection closed by server");
    return r == 0 ? IO_ERR : r;
}

/* ------------------------------------------------------------------ */
/* templates: {user} {uidx} {device} {didx} {token} {app} {key} {n}    */
/* {ts} {id} {cursor} {epoch}; any other brace text is copied as is    */
/* ------------------------------------------------------------------ */

typedef struct {
    long uidx, didx;
    long long n, cursor;
    uint64_t ts;
    const char *token, *id, *epoch;
} tvars_t;

static void user_name(char *out, size_t cap, long u) { snprintf(out, cap, "%s%ld", O.user_prefix, u); }
static void device_name(char *out, size_t cap, long d) { snprintf(out, cap, "%s%ld", O.device_prefix, d); }

static void expand(buf_t *b, const char *tpl, const tvars_t *v) {
    const char *p = tpl;
    while (*p) {
        const char *br = strchr(p, '{');
        if (!br) {
            buf_adds(b, p);
            return;
        }
        buf_add(b, p, (size_t)(br - p));
        const char *q = br + 1;
        while (*q && (islower((unsigned char)*q) || *q == '_')) q++;
        size_t nl = (size_t)(q - br - 1);
        int done = 0;
        if (*q == '}' && nl > 0) {
            char name[16];
            if (nl < sizeof name) {
                memcpy(name, br + 1, nl);
                name[nl] = 0;
                char tmp[160];
                done = 1;
                if (!strcmp(name, "user")) {
                    user_name(tmp, sizeof tmp, v->uidx);
                    buf_adds(b, tmp);
                } else if (!strcmp(name, "uidx")) buf_addf(b, "%ld", v->uidx);
                else if (!strcmp(name, "device")) {
                    device_name(tmp, sizeof tmp, v->didx);
                    buf_adds(b, tmp);
                } else if (!strcmp(name, "didx")) buf_addf(b, "%ld", v->didx);
                else if (!strcmp(name, "token")) buf_adds(b, v->token ? v->token : "");
                else if (!strcmp(name, "app")) buf_adds(b, O.app);
                else if (!strcmp(name, "key")) buf_adds(b, O.key);
                else if (!strcmp(name, "n")) buf_addf(b, "%lld", v->n);
                else if (!strcmp(name, "ts")) buf_addf(b, "%" PRIu64, v->ts);
                else if (!strcmp(name, "id")) buf_adds(b, v->id ? v->id : "");
                else if (!strcmp(name, "cursor")) buf_addf(b, "%lld", v->cursor);
                else if (!strcmp(name, "epoch")) buf_adds(b, v->epoch ? v->epoch : "");
                else done = 0;
            }
        }
        if (done) p = q + 1;
        else {
            buf_add(b, "{", 1);
            p = br + 1;
        }
    }
}

/* ------------------------------------------------------------------ */
/* HS256 JWT                                                           */
/* ------------------------------------------------------------------ */

static void b64url(buf_t *b, const unsigned char *d, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16;
        if (i + 1 < n) v |= (uint32_t)d[i + 1] << 8;
        if (i + 2 < n) v |= d[i + 2];
        char o[4] = {t[(v >> 18) & 63], t[(v >> 12) & 63], t[(v >> 6) & 63], t[v & 63]};
        size_t k = (i + 2 < n) ? 4 : (i + 1 < n) ? 3 : 2;
        buf_add(b, o, k);
    }
}

static char *make_token(long uidx) {
    if (!O.secret) return strdup("");
    char uname[160];
    user_name(uname, sizeof uname, uidx);
    time_t now = time(NULL);
    char claims[512];
    snprintf(claims, sizeof claims, "{\"app\":\"%s\",\"sub\":\"%s\",\"iat\":%ld,\"exp\":%ld}", O.app, uname,
             (long)now, (long)now + O.token_ttl);
    const char *hdr = "{\"alg\":\"HS256\",\"typ\":\"JWT\"}";
    buf_t b = {0};
    b64url(&b, (const unsigned char *)hdr, strlen(hdr));
    buf_add(&b, ".", 1);
    b64url(&b, (const unsigned char *)claims, strlen(claims));
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    if (!HMAC(EVP_sha256(), O.secret, (int)strlen(O.secret), (const unsigned char *)b.p, b.len, mac, &ml))
        die("HMAC failed");
    buf_add(&b, ".", 1);
    b64url(&b, mac, ml);
    return b.p;
}

/* ------------------------------------------------------------------ */
/* worker <-> parent protocol                                          */
/* ------------------------------------------------------------------ */

enum { C_STEP = 1, C_REPORT, C_PUBLISH, C_DISMISS, C_DISCONNECT, C_RECONNECT, C_QUIT };
typedef struct {
    int32_t type, step;
    int64_t n0, count; /* message range [n0, n0+count) */
    double rate, seconds;
    uint64_t t0; /* absolute monotonic start of the schedule */
} cmd_t;

enum { R_READY = 1, R_REPORT, R_PUBDONE, R_DISMISS, R_DISCONNECTED, R_RECONNECTED };
/* counter slots in res_t.a[] */
enum {
    /* R_READY / R_RECONNECTED */
    A_READY = 0, A_FAILED, A_T_FIRST, A_T_LAST,
    /* R_REPORT */
    A_UNIQUE = 0, A_DUP, A_MISROUTED, A_BADNUM, A_FIRST_RECV, A_LAST_RECV, A_DROPPED, A_FRAMES,
    /* R_PUBDONE */
    A_OK = 0, A_ERR, A_UNSENT, A_T_FIRST_SEND, A_T_LAST_SEND, A_T_LAST_RESP, A_STALLS, A_RETRIES,
    /* R_DISMISS */
    A_D_USERS = 0, A_D_SENT, A_D_COMPLETE, A_D_RECEIVED, A_D_EXPECTED, A_D_NOID,
};
typedef struct {
    int32_t type, step, wid, pad;
    uint64_t a[16];
    hist_t h;  /* latency */
    hist_t h2; /* setup time (ready/reconnect) or publisher lag */
    char err[240];
} res_t;

/* ------------------------------------------------------------------ */
/* subscriber worker                                                   */
/* ------------------------------------------------------------------ */

enum { S_QUEUED = 0, S_CONNECTING, S_HANDSHAKE, S_UPGRADING, S_WAITREADY, S_READY, S_CLOSED, S_FAILED };

typedef struct {
    int fd;
    SSL *ssl; /* wss:// */
    uint8_t state;
    uint8_t frag_op;
    uint8_t resume;
    uint8_t hs_want_out; /* S_HANDSHAKE: waiting for the socket to be writable */
    long uidx, didx; /* global user index and device index */
    uint64_t t_start;
    buf_t r, w, frag;
    size_t woff;
    uint8_t *seen; /* bit k set: message n = k*users + uidx received */
    long long cursor;
    char *epoch;
} sconn_t;

typedef struct {
    char *token;
    char *nid;       /* dismiss: notification id */
    uint64_t d_sent; /* dismiss: when device 0 sent the update */
    int d_got;       /* dismiss: other devices that saw the change */
} suser_t;

typedef struct {
    int64_t n0, n1; /* [n0, n1) */
    hist_t *h;
    uint64_t unique, dup, first, last;
    int active;
} sstep_t;

static struct {
    int wid, ep, cmd_fd, res_fd;
    struct sockaddr_in src;
    long u0, u1; /* users [u0,u1) */
    long nconns;
    sconn_t *c;
    suser_t *u;
    long queue_next; /* next connection index to start */
    long inflight, ready, failed, dropped;
    uint64_t t_first, t_last;
    hist_t setup;
    int ready_reported, reconnect_pending;
    uint64_t setup_deadline;
    sstep_t steps[MAX_STEPS];
    int64_t n_total_max; /* bitmap size in messages */
    size_t seen_bytes;
    uint64_t misrouted, badnum, frames;
    char err[240];
    /* dismiss */
    int dismiss_on;
    long d_next; /* next local user to send */
    uint64_t d_t0;
    double d_rate;
    uint64_t d_deadline;
    hist_t *d_hist;
    long d_complete, d_received, d_sent, d_noid;
} W;

static void w_note_err(const char *fmt, ...) {
    if (W.err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(W.err, sizeof W.err, fmt, ap);
    va_end(ap);
}

static void sc_update_events(sconn_t *c) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(c - W.c)};
    if (c->state == S_CONNECTING || (c->state == S_HANDSHAKE && c->hs_want_out) || c->w.len > c->woff)
        ev.events |= EPOLLOUT;
    epoll_ctl(W.ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void sc_close(sconn_t *c, int newstate) {
    SSL_free(c->ssl);
    c->ssl = NULL;
    if (c->fd >= 0) {
        epoll_ctl(W.ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
    c->state = (uint8_t)newstate;
    buf_free(&c->r);
    buf_free(&c->w);
    buf_free(&c->frag);
    c->woff = 0;
}

static void sc_flush(sconn_t *c) {
    while (c->w.len > c->woff) {
        ssize_t n = io_send(c->fd, c->ssl, c->w.p + c->woff, c->w.len - c->woff);
        if (n == IO_AGAIN) break;
        if (n < 0) return; /* error surfaces on read */
        c->woff += (size_t)n;
    }
    if (c->woff == c->w.len) {
        c->w.len = c->woff = 0;
    }
    sc_update_events(c);
}

static void sc_send_frame(sconn_t *c, int op, const char *d, size_t n) {
    unsigned char h[14];
    size_t hl = 0;
    h[hl++] = (unsigned char)(0x80 | op);
    if (n < 126) h[hl++] = (unsigned char)(0x80 | n);
    else if (n < 65536) {
        h[hl++] = 0x80 | 126;
        h[hl++] = (unsigned char)(n >> 8);
        h[hl++] = (unsigned char)n;
    } else {
        h[hl++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--) h[hl++] = (unsigned char)((uint64_t)n >> (8 * i));
    }
    uint32_t r = (uint32_t)random();
    unsigned char mk[4] = {(unsigned char)r, (unsigned char)(r >> 8), (unsigned char)(r >> 16), (unsigned char)(r >> 24)};
    memcpy(h + hl, mk, 4);
    hl += 4;
    buf_add(&c->w, h, hl);
    buf_reserve(&c->w, n + 1);
    unsigned char *o = (unsigned char *)c->w.p + c->w.len;
    for (size_t i = 0; i < n; i++) o[i] = (unsigned char)d[i] ^ mk[i & 3];
    c->w.len += n;
    sc_flush(c);
}

static int worker_all_settled(void) { return W.ready + W.failed >= W.nconns; }

static void sc_start(sconn_t *c) {
    c->t_start = now_ns();
    if (!W.t_first) W.t_first = c->t_start;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        w_note_err("socket: %s", strerror(errno));
        c->state = S_FAILED;
        W.failed++;
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&W.src, sizeof W.src) < 0) {
        w_note_err("bind: %s", strerror(errno));
        close(fd);
        c->state = S_FAILED;
        W.failed++;
        return;
    }
    if (connect(fd, (struct sockaddr *)&SC_URL(c)->addr, sizeof SC_URL(c)->addr) < 0 && errno != EINPROGRESS) {
        w_note_err("connect: %s", strerror(errno));
        close(fd);
        c->state = S_FAILED;
        W.failed++;
        return;
    }
    c->fd = fd;
    c->state = S_CONNECTING;
    W.inflight++;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = (uint64_t)(c - W.c)};
    epoll_ctl(W.ep, EPOLL_CTL_ADD, fd, &ev);
}

static void pump_connects(void) {
    while (W.queue_next < W.nconns && W.inflight < O.connect_conc) {
        sconn_t *c = &W.c[W.queue_next++];
        if (c->state == S_QUEUED) sc_start(c);
    }
}

static void sc_became_ready(sconn_t *c) {
    c->state = S_READY;
    W.inflight--;
    W.ready++;
    uint64_t t = now_ns();
    W.t_last = t;
    h_add(&W.setup, t - c->t_start);
    pump_connects();
}

static void sc_fail(sconn_t *c, const char *why) {
    int was_pending = c->state == S_CONNECTING || c->state == S_HANDSHAKE || c->state == S_UPGRADING ||
                      c->state == S_WAITREADY;
    if (was_pending) {
        W.inflight--;
        W.failed++;
        w_note_err("user %ld device %ld: %s", c->uidx, c->didx, why);
    } else if (c->state == S_READY) {
        W.dropped++;
        w_note_err("user %ld device %ld dropped: %s", c->uidx, c->didx, why);
    }
    sc_close(c, was_pending ? S_FAILED : S_CLOSED);
    pump_connects();
}

static tvars_t sc_vars(sconn_t *c) {
    tvars_t v = {0};
    v.uidx = c->uidx;
    v.didx = c->didx;
    suser_t *u = &W.u[c->uidx - W.u0];
    if (!u->token) u->token = make_token(c->uidx);
    v.token = u->token;
    v.cursor = c->cursor;
    v.epoch = c->epoch ? c->epoch : "";
    v.id = u->nid;
    return v;
}

static void sc_send_upgrade(sconn_t *c) {
    tvars_t v = sc_vars(c);
    buf_t path = {0};
    expand(&path, SC_URL(c)->path, &v);
    unsigned char key[16];
    for (int i = 0; i < 16; i++) key[i] = (unsigned char)random();
    buf_t k = {0};
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 16; i += 3) {
        uint32_t x = (uint32_t)key[i] << 16;
        if (i + 1 < 16) x |= (uint32_t)key[i + 1] << 8;
        if (i + 2 < 16) x |= key[i + 2];
        char o[4] = {t[(x >> 18) & 63], t[(x >> 12) & 63], i + 1 < 16 ? t[(x >> 6) & 63] : '=',
                     i + 2 < 16 ? t[x & 63] : '='};
        buf_add(&k, o, 4);
    }
    buf_addf(&c->w,
             "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n",
             path.p, SC_URL(c)->hostport, k.p);
    for (int i = 0; i < O.n_sub_headers; i++) {
        buf_t h = {0};
        expand(&h, O.sub_headers[i], &v);
        buf_addf(&c->w, "%s\r\n", h.p);
        buf_free(&h);
    }
    buf_adds(&c->w, "\r\n");
    buf_free(&path);
    buf_free(&k);
    c->state = S_UPGRADING;
    sc_flush(c);
}

static int64_t parse_int_after(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    int neg = 0;
    if (p < end && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= end || !isdigit((unsigned char)*p)) return INT64_MIN;
    int64_t v = 0;
    while (p < end && isdigit((unsigned char)*p)) v = v * 10 + (*p++ - '0');
    return neg ? -v : v;
}

/* copy the JSON string value that follows key pattern `"key":` */
static char *json_str_after(const char *p, size_t len, const char *key) {
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *k = memmem(p, len, pat, strlen(pat));
    if (!k) return NULL;
    const char *q = k + strlen(pat);
    const char *end = p + len;
    while (q < end && *q == ' ') q++;
    if (q >= end || *q != '"') return NULL;
    q++;
    const char *e = memchr(q, '"', (size_t)(end - q));
    if (!e) return NULL;
    return strndup(q, (size_t)(e - q));
}

static sstep_t *step_of(int64_t n) {
    for (int i = 0; i < MAX_STEPS; i++)
        if (W.steps[i].active && n >= W.steps[i].n0 && n < W.steps[i].n1) return &W.steps[i];
    return NULL;
}

static void record_delivery(sconn_t *c, int64_t n, int64_t t, uint64_t now) {
    if (n < 0 || n >= W.n_total_max) {
        W.badnum++;
        return;
    }
    if (n % O.users != c->uidx) {
        W.misrouted++;
        return;
    }
    int64_t k = n / O.users;
    sstep_t *s = step_of(n);
    if (!c->seen) c->seen = xcalloc(1, W.seen_bytes);
    if (c->seen[k >> 3] & (1u << (k & 7))) {
        if (s) s->dup++;
        return;
    }
    c->seen[k >> 3] |= (uint8_t)(1u << (k & 7));
    if (!s) return;
    s->unique++;
    if (!s->first || now < s->first) s->first = now;
    if (now > s->last) s->last = now;
    h_add(s->h, (t > 0 && (uint64_t)t < now) ? now - (uint64_t)t : 0);
}

static void scan_deliveries(sconn_t *c, const char *p, size_t len, uint64_t now) {
    char tp[64], np[64];
    snprintf(tp, sizeof tp, "\"%s\":", O.ts_key);
    snprintf(np, sizeof np, "\"%s\":", O.n_key);
    size_t tl = strlen(tp), nl = strlen(np);
    const char *end = p + len, *pt = p, *pn = p;
    for (int guard = 0; guard < 100000; guard++) {
        const char *ft = memmem(pt, (size_t)(end - pt), tp, tl);
        const char *fn = memmem(pn, (size_t)(end - pn), np, nl);
        if (!ft || !fn) break;
        int64_t t = parse_int_after(ft + tl, end);
        int64_t n = parse_int_after(fn + nl, end);
        pt = ft + tl;
        pn = fn + nl;
        if (n == INT64_MIN) {
            W.badnum++;
            continue;
        }
        record_delivery(c, n, t == INT64_MIN ? 0 : t, now);
    }
}

static void on_text(sconn_t *c, const char *p, size_t len, uint64_t now) {
    W.frames++;
    if (c->state == S_WAITREADY) {
        if (len >= 15 && memmem(p, len, "\"type\":\"error\"", 14)) {
            char tmp[160];
            snprintf(tmp, sizeof tmp, "error frame before ready: %.*s", (int)(len > 120 ? 120 : len), p);
            w_note_err("%s", tmp);
        }
        if (O.ready_match && memmem(p, len, O.ready_match, strlen(O.ready_match))) {
            /* welcome: remember cursor and epoch for a later resume */
            const char *cp = memmem(p, len, "\"cursor\":", 9);
            if (cp) {
                int64_t v = parse_int_after(cp + 9, p + len);
                if (v != INT64_MIN) c->cursor = v;
            }
            char *ep = json_str_after(p, len, "epoch");
            if (ep) {
                free(c->epoch);
                c->epoch = ep;
            }
            sc_became_ready(c);
            return;
        }
    }
    if (W.dismiss_on && O.dismiss_match && memmem(p, len, O.dismiss_match, strlen(O.dismiss_match)) &&
        (!O.msg_filter || memmem(p, len, O.msg_filter, strlen(O.msg_filter)))) {
        if (c->didx != 0) {
            suser_t *u = &W.u[c->uidx - W.u0];
            if (u->d_sent && u->d_got < O.devices - 1) {
                u->d_got++;
                W.d_received++;
                h_add(W.d_hist, now - u->d_sent);
                if (u->d_got == O.devices - 1) W.d_complete++;
            }
        }
        return;
    }
    if (O.msg_filter && !memmem(p, len, O.msg_filter, strlen(O.msg_filter))) return;
    if (O.mode == M_DISMISS && c->didx == 0) {
        suser_t *u = &W.u[c->uidx - W.u0];
        if (!u->nid) {
            const char *q = memmem(p, len, "\"notification\"", 14);
            if (!q) q = p;
            u->nid = json_str_after(q, (size_t)(p + len - q), O.id_key);
        }
    }
    scan_deliveries(c, p, len, now);
}

/* returns -1 when the connection was closed */
static int sc_parse_frames(sconn_t *c, uint64_t now) {
    size_t off = 0;
    int rc = 0;
    for (int guard = 0; guard < 1000000; guard++) {
        size_t av = c->r.len - off;
        if (av < 2) break;
        unsigned char *h = (unsigned char *)c->r.p + off;
        int fin = h[0] & 0x80, op = h[0] & 0x0f, masked = h[1] & 0x80;
        uint64_t plen = h[1] & 0x7f;
        size_t hl = 2;
        if (plen == 126) {
            if (av < 4) break;
            plen = ((uint64_t)h[2] << 8) | h[3];
            hl = 4;
        } else if (plen == 127) {
            if (av < 10) break;
            plen = 0;
            for (int i = 0; i < 8; i++) plen = (plen << 8) | h[2 + i];
            hl = 10;
        }
        if (plen > (64u << 20)) {
            sc_fail(c, "frame too large");
            return -1;
        }
        size_t mko = hl;
        if (masked) hl += 4;
        if (av < hl + plen) break;
        char *pl = (char *)h + hl;
        if (masked)
            for (uint64_t i = 0; i < plen; i++) pl[i] ^= (char)h[mko + (i & 3)];
        if (op == 0x8) { /* close */
            int code = plen >= 2 ? ((unsigned char)pl[0] << 8 | (unsigned char)pl[1]) : 1005;
            char why[200];
            snprintf(why, sizeof why, "closed by server, code %d %.*s", code, (int)(plen > 2 ? (plen - 2 > 100 ? 100 : plen - 2) : 0),
                     pl + 2);
            sc_fail(c, why);
            return -1;
        } else if (op == 0x9) {
            sc_send_frame(c, 0xA, pl, (size_t)plen);
        } else if (op == 0xA) {
            /* pong: ignore */
        } else if (op == 0x0) {
            buf_add(&c->frag, pl, (size_t)plen);
            if (fin) {
                if (c->frag_op == 1) on_text(c, c->frag.p, c->frag.len, now);
                c->frag.len = 0;
            }
        } else if (op == 0x1 || op == 0x2) {
            if (fin) {
                if (op == 1) on_text(c, pl, (size_t)plen, now);
            } else {
                c->frag_op = (uint8_t)op;
                c->frag.len = 0;
                buf_add(&c->frag, pl, (size_t)plen);
            }
        }
        if (c->fd < 0) return -1;
        off += hl + plen;
    }
    if (off) {
        memmove(c->r.p, c->r.p + off, c->r.len - off);
        c->r.len -= off;
    }
    return rc;
}

static void sc_on_handshake(sconn_t *c) {
    char *e = memmem(c->r.p, c->r.len, "\r\n\r\n", 4);
    if (!e) {
        if (c->r.len > 16384) sc_fail(c, "oversized handshake response");
        return;
    }
    if (c->r.len < 12 || strncmp(c->r.p, "HTTP/1.1 101", 12) != 0) {
        char why[160];
        char *nl = memchr(c->r.p, '\r', c->r.len);
        snprintf(why, sizeof why, "upgrade refused: %.*s", (int)(nl ? nl - c->r.p : 60), c->r.p);
        sc_fail(c, why);
        return;
    }
    size_t hl = (size_t)(e + 4 - c->r.p);
    memmove(c->r.p, c->r.p + hl, c->r.len - hl);
    c->r.len -= hl;
    const char *hello = (c->resume && O.resume_hello) ? O.resume_hello : O.hello;
    if (hello) {
        tvars_t v = sc_vars(c);
        buf_t m = {0};
        expand(&m, hello, &v);
        sc_send_frame(c, 1, m.p, m.len);
        buf_free(&m);
    }
    c->state = S_WAITREADY;
    if (!O.ready_match) sc_became_ready(c);
}

static void sc_handshake(sconn_t *c) {
    int want_out = 0, r = io_handshake(c->ssl, &want_out);
    if (r == IO_ERR) {
        sc_fail(c, io_why);
        return;
    }
    if (r == 1) {
        sc_send_upgrade(c);
        return;
    }
    c->hs_want_out = (uint8_t)want_out;
    sc_update_events(c);
}

static void sc_on_event(sconn_t *c, uint32_t evs) {
    if (c->state == S_CONNECTING) {
        if (evs & (EPOLLOUT | EPOLLERR | EPOLLHUP)) {
            int err = 0;
            socklen_t l = sizeof err;
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
            if (err) {
                char why[100];
                snprintf(why, sizeof why, "connect: %s", strerror(err));
                sc_fail(c, why);
                return;
            }
            if (SC_URL(c)->tls) {
                c->ssl = tls_new(c->fd, SC_URL(c));
                c->state = S_HANDSHAKE;
                sc_handshake(c);
            } else sc_send_upgrade(c);
        }
        return;
    }
    if (c->state == S_HANDSHAKE) {
        sc_handshake(c);
        return;
    }
    if (evs & EPOLLOUT) sc_flush(c);
    if (c->fd < 0) return;
    if (evs & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
        /* TLS: a read returns one record at most, and the bytes a read leaves
           in the SSL object raise no epoll event, so read on while it holds
           some (bounded: it holds one record at most, and reading them takes
           nothing more from the socket) */
        for (int i = 0; i < 64 || (c->ssl && SSL_pending(c->ssl) > 0); i++) {
            buf_reserve(&c->r, 16384);
            ssize_t n = io_recv(c->fd, c->ssl, c->r.p + c->r.len, c->r.cap - c->r.len - 1);
            if (n == IO_AGAIN) break;
            if (n == IO_ERR) {
                sc_fail(c, io_why);
                return;
            }
            if (n == 0) {
                sc_fail(c, "connection closed by server");
                return;
            }
            c->r.len += (size_t)n;
            uint64_t now = now_ns();
            if (c->state == S_UPGRADING) {
                sc_on_handshake(c);
                if (c->fd < 0) return;
                if (c->state == S_UPGRADING) continue;
            }
            if (sc_parse_frames(c, now) < 0) return;
            /* plain: a short read emptied the socket; TLS reads until it must wait */
            if (!c->ssl && (size_t)n < 16384) break;
        }
        /* keep idle buffers small */
        if (c->r.len == 0 && c->r.cap > 65536) buf_free(&c->r);
    }
}

static void w_send_res(res_t *r) { write_full(W.res_fd, r, sizeof *r); }

static void w_report_ready(int type) {
    res_t *r = xcalloc(1, sizeof *r);
    r->type = type;
    r->wid = W.wid;
    r->a[A_READY] = (uint64_t)W.ready;
    r->a[A_FAILED] = (uint64_t)(W.nconns - W.ready);
    r->a[A_T_FIRST] = W.t_first;
    r->a[A_T_LAST] = W.t_last;
    r->h2 = W.setup;
    snprintf(r->err, sizeof r->err, "%s", W.err);
    w_send_res(r);
    free(r);
}

static void w_begin_connect(int resume) {
    W.queue_next = 0;
    W.inflight = W.ready = W.failed = 0;
    W.t_first = W.t_last = 0;
    memset(&W.setup, 0, sizeof W.setup);
    W.err[0] = 0;
    for (long i = 0; i < W.nconns; i++) {
        W.c[i].state = S_QUEUED;
        W.c[i].resume = (uint8_t)resume;
    }
    W.setup_deadline = now_ns() + (uint64_t)(O.setup_timeout * 1e9);
    W.ready_reported = 0;
    pump_connects();
}

static void w_handle_cmd(const cmd_t *m) {
    if (m->type == C_STEP) {
        sstep_t *s = &W.steps[m->step];
        s->n0 = m->n0;
        s->n1 = m->n0 + m->count;
        if (!s->h) s->h = xcalloc(1, sizeof(hist_t));
        s->active = 1;
    } else if (m->type == C_REPORT) {
        sstep_t *s = &W.steps[m->step];
        res_t *r = xcalloc(1, sizeof *r);
        r->type = R_REPORT;
        r->step = m->step;
        r->wid = W.wid;
        r->a[A_UNIQUE] = s->unique;
        r->a[A_DUP] = s->dup;
        r->a[A_MISROUTED] = W.misrouted;
        r->a[A_BADNUM] = W.badnum;
        r->a[A_FIRST_RECV] = s->first;
        r->a[A_LAST_RECV] = s->last;
        r->a[A_DROPPED] = (uint64_t)W.dropped;
        r->a[A_FRAMES] = W.frames;
        if (s->h) r->h = *s->h;
        snprintf(r->err, sizeof r->err, "%s", W.err);
        w_send_res(r);
        free(r);
    } else if (m->type == C_DISMISS) {
        W.dismiss_on = 1;
        W.d_next = 0;
        W.d_t0 = now_ns();
        W.d_rate = m->rate * (double)(W.u1 - W.u0) / (double)O.users;
        if (W.d_rate <= 0) W.d_rate = 1;
        W.d_deadline = W.d_t0 + (uint64_t)(((double)(W.u1 - W.u0) / W.d_rate + m->seconds) * 1e9);
        if (!W.d_hist) W.d_hist = xcalloc(1, sizeof(hist_t));
    } else if (m->type == C_DISCONNECT) {
        for (long i = 0; i < W.nconns; i++) {
            sconn_t *c = &W.c[i];
            if (c->fd >= 0) {
                static const char cl[] = {0x03, (char)0xE8}; /* 1000 */
                sc_send_frame(c, 0x8, cl, 2);
                if (c->ssl) SSL_shutdown(c->ssl); /* close_notify */
                shutdown(c->fd, SHUT_WR);
                sc_close(c, S_QUEUED);
            }
        }
        res_t *r = xcalloc(1, sizeof *r);
        r->type = R_DISCONNECTED;
        r->wid = W.wid;
        w_send_res(r);
        free(r);
    } else if (m->type == C_RECONNECT) {
        W.dropped = 0;
        w_begin_connect(1);
        W.reconnect_pending = 1;
    } else if (m->type == C_QUIT) {
        for (long i = 0; i < W.nconns; i++)
            if (W.c[i].fd >= 0) close(W.c[i].fd);
        _exit(0);
    }
}

static void w_dismiss_tick(uint64_t now) {
    long nlocal = W.u1 - W.u0;
    while (W.d_next < nlocal) {
        uint64_t due = W.d_t0 + (uint64_t)((double)W.d_next * 1e9 / W.d_rate);
        if (due > now) break;
        suser_t *u = &W.u[W.d_next];
        long ui = W.u0 + W.d_next;
        sconn_t *c = &W.c[(ui - W.u0) * O.devices]; /* device 0 */
        W.d_next++;
        if (!u->nid || c->state != S_READY) {
            W.d_noid++;
            continue;
        }
        tvars_t v = sc_vars(c);
        v.n = ui;
        buf_t m = {0};
        expand(&m, O.dismiss_frame, &v);
        u->d_sent = now_ns();
        W.d_sent++;
        sc_send_frame(c, 1, m.p, m.len);
        buf_free(&m);
    }
    int done = W.d_next >= nlocal && W.d_complete + W.d_noid >= nlocal;
    if (done || now >= W.d_deadline) {
        res_t *r = xcalloc(1, sizeof *r);
        r->type = R_DISMISS;
        r->wid = W.wid;
        r->a[A_D_USERS] = (uint64_t)nlocal;
        r->a[A_D_SENT] = (uint64_t)W.d_sent;
        r->a[A_D_COMPLETE] = (uint64_t)W.d_complete;
        r->a[A_D_RECEIVED] = (uint64_t)W.d_received;
        r->a[A_D_EXPECTED] = (uint64_t)W.d_sent * (uint64_t)(O.devices - 1);
        r->a[A_D_NOID] = (uint64_t)W.d_noid;
        r->h = *W.d_hist;
        snprintf(r->err, sizeof r->err, "%s", W.err);
        w_send_res(r);
        free(r);
        W.dismiss_on = 0;
    }
}

static void sub_worker(int wid, long u0, long u1, int cmd_fd, int res_fd, int64_t n_total_max) {
    static char role[32];
    snprintf(role, sizeof role, "loadgen[sub %d]", wid);
    g_role = role;
    srandom((unsigned)(getpid() ^ now_ns()));
    W.wid = wid;
    W.cmd_fd = cmd_fd;
    W.res_fd = res_fd;
    W.u0 = u0;
    W.u1 = u1;
    W.nconns = (u1 - u0) * O.devices;
    W.n_total_max = n_total_max;
    W.seen_bytes = (size_t)(n_total_max / O.users / 8 + 2);
    W.src.sin_family = AF_INET;
    W.src.sin_port = 0;
    W.src.sin_addr.s_addr = htonl((127u << 24) | (uint32_t)(O.src_base + wid));
    W.c = xcalloc((size_t)W.nconns, sizeof(sconn_t));
    W.u = xcalloc((size_t)(u1 - u0), sizeof(suser_t));
    for (long i = 0; i < W.nconns; i++) {
        W.c[i].fd = -1;
        W.c[i].uidx = u0 + i / O.devices;
        W.c[i].didx = i % O.devices;
    }
    W.ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    epoll_ctl(W.ep, EPOLL_CTL_ADD, cmd_fd, &ev);
    uint64_t hard_end = now_ns() + (uint64_t)(O.max_run * 1e9);
    w_begin_connect(0);
    struct epoll_event evs[512];
    for (;;) {
        uint64_t now = now_ns();
        if (now > hard_end) _exit(4);
        int timeout = 200;
        if (W.dismiss_on) timeout = 1;
        int n = epoll_wait(W.ep, evs, 512, timeout);
        if (n < 0 && errno != EINTR) die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            if (evs[i].data.u64 == UINT64_MAX) {
                cmd_t m;
                ssize_t r = read(cmd_fd, &m, sizeof m);
                if (r == 0) _exit(0); /* parent gone */
                if (r == (ssize_t)sizeof m) w_handle_cmd(&m);
                continue;
            }
            sconn_t *c = &W.c[evs[i].data.u64];
            if (c->fd < 0) continue;
            sc_on_event(c, evs[i].events);
        }
        now = now_ns();
        if (!W.ready_reported && (worker_all_settled() || now > W.setup_deadline)) {
            if (!worker_all_settled()) {
                w_note_err("setup timeout: %ld ready, %ld failed of %ld", W.ready, W.failed, W.nconns);
                for (long i = 0; i < W.nconns; i++) {
                    sconn_t *c = &W.c[i];
                    if (c->state != S_READY && c->state != S_FAILED && c->state != S_CLOSED) {
                        if (c->fd >= 0) sc_close(c, S_FAILED);
                        c->state = S_FAILED;
                    }
                }
                W.queue_next = W.nconns;
            }
            W.ready_reported = 1;
            w_report_ready(W.reconnect_pending ? R_RECONNECTED : R_READY);
            W.reconnect_pending = 0;
        }
        if (W.dismiss_on) w_dismiss_tick(now);
    }
}

/* ------------------------------------------------------------------ */
/* publisher worker                                                    */
/* ------------------------------------------------------------------ */

typedef struct {
    int fd;
    SSL *ssl;  /* https:// */
    int hs;    /* TLS handshake under way: not idle yet, a retried request waits */
    int busy, want_out, in_idle, retried;
    buf_t r, w, req; /* req: copy of the request in flight, for one retry */
    size_t woff;
} pconn_t;

static struct {
    int wid, nprocs, ep;
    pconn_t *c;
    int nc;
    int *idle;
    int nidle;
    uint64_t ok, err, stalls, retries;
    char errs[240];
} P;

static void p_note(const char *fmt, ...) {
    if (P.errs[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(P.errs, sizeof P.errs, fmt, ap);
    va_end(ap);
}

static void p_flush(pconn_t *c);
/* several --pub-url (several nodes): publisher connection k on URL k mod n */
#define PC_URL(c) (&PUB_URLS[((c) - P.c) % O.n_pub_urls])
static int p_connect(pconn_t *c) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&PC_URL(c)->addr, sizeof PC_URL(c)->addr) < 0) {
        p_note("publisher connect: %s", strerror(errno));
        close(fd);
        return -1;
    }
    set_nonblock(fd);
    c->fd = fd;
    c->busy = 0;
    c->want_out = 0;
    c->r.len = 0;
    c->w.len = c->woff = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(c - P.c)};
    if (PC_URL(c)->tls) { /* the handshake starts once epoll says writable */
        c->ssl = tls_new(fd, PC_URL(c));
        c->hs = 1;
        c->want_out = 1;
        ev.events |= EPOLLOUT;
    }
    epoll_ctl(P.ep, EPOLL_CTL_ADD, fd, &ev);
    return 0;
}

static void p_want_out(pconn_t *c, int want_out) { /* touch epoll only when interest changes */
    if (want_out == c->want_out) return;
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.u64 = (uint64_t)(c - P.c)};
    epoll_ctl(P.ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want_out;
}

/* each connection is on the idle stack at most once */
static void p_push_idle(pconn_t *c) {
    if (c->in_idle || c->fd < 0 || c->hs) return;
    c->in_idle = 1;
    P.idle[P.nidle++] = (int)(c - P.c);
}
static pconn_t *p_pop_idle(void) {
    while (P.nidle > 0) {
        pconn_t *c = &P.c[P.idle[--P.nidle]];
        c->in_idle = 0;
        if (c->fd >= 0 && !c->busy) return c;
    }
    return NULL;
}

static void p_reset(pconn_t *c) {
    SSL_free(c->ssl);
    c->ssl = NULL;
    c->hs = 0;
    if (c->fd >= 0) {
        epoll_ctl(P.ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    c->fd = -1;
    /* a keep-alive connection the server closed just as a request went out:
       nothing of the answer arrived, so send the request once more */
    if (c->busy && !c->retried && c->r.len == 0 && c->req.len) {
        c->r.len = 0;
        c->w.len = c->woff = 0;
        if (p_connect(c) == 0) {
            c->retried = 1;
            c->busy = 1;
            P.retries++;
            buf_add(&c->w, c->req.p, c->req.len);
            p_flush(c);
            return;
        }
    }
    if (c->busy) P.err++;
    c->busy = 0;
    c->r.len = 0;
    c->w.len = c->woff = 0;
    if (p_connect(c) == 0) p_push_idle(c);
}

static void p_flush(pconn_t *c) {
    if (c->hs) return; /* sent once the handshake is done */
    while (c->w.len > c->woff) {
        ssize_t n = io_send(c->fd, c->ssl, c->w.p + c->woff, c->w.len - c->woff);
        if (n == IO_AGAIN) break;
        if (n < 0) return;
        c->woff += (size_t)n;
    }
    int want_out = c->w.len > c->woff;
    if (!want_out) c->w.len = c->woff = 0;
    p_want_out(c, want_out);
}

static void p_handshake(pconn_t *c) {
    int want_out = 0, r = io_handshake(c->ssl, &want_out);
    if (r == IO_ERR) {
        p_note("publisher %s", io_why);
        p_reset(c);
        return;
    }
    if (r == IO_AGAIN) {
        p_want_out(c, want_out);
        return;
    }
    c->hs = 0;
    p_want_out(c, 0);
    if (c->busy) p_flush(c); /* a request retried on this new connection */
    else p_push_idle(c);
}

static void p_send(pconn_t *c, int64_t n, uint64_t ts) {
    tvars_t v = {0};
    v.uidx = (long)(n % O.users);
    v.n = n;
    v.ts = ts;
    buf_t path = {0}, body = {0};
    expand(&path, PC_URL(c)->path, &v);
    if (O.pub_body) expand(&body, O.pub_body, &v);
    buf_addf(&c->w, "%s %s HTTP/1.1\r\nHost: %s\r\n", O.pub_method, path.p, PC_URL(c)->hostport);
    for (int i = 0; i < O.n_pub_headers; i++) {
        buf_t h = {0};
        expand(&h, O.pub_headers[i], &v);
        buf_addf(&c->w, "%s\r\n", h.p);
        buf_free(&h);
    }
    buf_addf(&c->w, "Content-Length: %zu\r\n\r\n", body.len);
    if (body.len) buf_add(&c->w, body.p, body.len);
    buf_free(&path);
    buf_free(&body);
    c->req.len = 0;
    buf_add(&c->req, c->w.p + c->woff, c->w.len - c->woff);
    c->retried = 0;
    c->busy = 1;
    p_flush(c);
}

/* parse one complete HTTP response at the start of c->r; return its length, 0 if incomplete, -1 bad */
static long p_parse_resp(pconn_t *c, int *status, int *close_after) {
    char *e = memmem(c->r.p, c->r.len, "\r\n\r\n", 4);
    if (!e) return c->r.len > 65536 ? -1 : 0;
    size_t hl = (size_t)(e + 4 - c->r.p);
    if (c->r.len < 12 || strncmp(c->r.p, "HTTP/1.", 7) != 0) return -1;
    *status = atoi(c->r.p + 9);
    long clen = -1;
    int chunked = 0;
    *close_after = 0;
    for (char *l = strstr(c->r.p, "\r\n"); l && l < e; l = strstr(l + 2, "\r\n")) {
        char *h = l + 2;
        if (!strncasecmp(h, "Content-Length:", 15)) clen = atol(h + 15);
        else if (!strncasecmp(h, "Transfer-Encoding:", 18) && strcasestr(h, "chunked") && strcasestr(h, "chunked") < strstr(h, "\r\n"))
            chunked = 1;
        else if (!strncasecmp(h, "Connection:", 11) && strcasestr(h, "close") && strcasestr(h, "close") < strstr(h, "\r\n"))
            *close_after = 1;
    }
    if (*status == 204 || *status == 304 || (*status >= 100 && *status < 200)) clen = 0;
    if (chunked) {
        size_t off = hl;
        for (int g = 0; g < 100000; g++) {
            char *le = memmem(c->r.p + off, c->r.len - off, "\r\n", 2);
            if (!le) return 0;
            long sz = strtol(c->r.p + off, NULL, 16);
            off = (size_t)(le + 2 - c->r.p);
            if (sz == 0) {
                char *te = memmem(c->r.p + off, c->r.len - off, "\r\n", 2);
                /* trailers: assume none; expect CRLF */
                if (!te) return 0;
                return (long)(te + 2 - c->r.p);
            }
            if (c->r.len < off + (size_t)sz + 2) return 0;
            off += (size_t)sz + 2;
        }
        return -1;
    }
    if (clen < 0) {
        *close_after = 1; /* body until close: not supported, treat as done */
        clen = 0;
    }
    if (c->r.len < hl + (size_t)clen) return 0;
    return (long)(hl + (size_t)clen);
}

static void p_on_event(pconn_t *c, uint32_t evs, uint64_t *t_last_resp) {
    if (c->hs) {
        p_handshake(c);
        return;
    }
    if (evs & EPOLLOUT) p_flush(c);
    if (c->fd < 0) return;
    if (!(evs & (EPOLLIN | EPOLLERR | EPOLLHUP))) return;
    /* TLS: read while the SSL object holds bytes (no epoll event for them) */
    for (int i = 0; i < 16 || (c->ssl && SSL_pending(c->ssl) > 0); i++) {
        buf_reserve(&c->r, 8192);
        ssize_t n = io_recv(c->fd, c->ssl, c->r.p + c->r.len, c->r.cap - c->r.len - 1);
        if (n == IO_AGAIN) break;
        if (n <= 0) {
            if (n == IO_ERR && c->ssl) p_note("publisher %s", io_why);
            if (c->busy && (c->retried || c->r.len)) p_note("publish connection closed mid-request");
            p_reset(c);
            return;
        }
        c->r.len += (size_t)n;
        c->r.p[c->r.len] = 0;
        for (;;) {
            int status = 0, cl = 0;
            long used = p_parse_resp(c, &status, &cl);
            if (used == 0) break;
            if (used < 0) {
                p_note("unparseable publish response");
                p_reset(c);
                return;
            }
            if (status >= 200 && status < 300) P.ok++;
            else {
                P.err++;
                char *nl = strstr(c->r.p, "\r\n");
                p_note("publish answered %.*s", (int)(nl ? nl - c->r.p : 40), c->r.p);
            }
            *t_last_resp = now_ns();
            memmove(c->r.p, c->r.p + used, c->r.len - (size_t)used);
            c->r.len -= (size_t)used;
            c->busy = 0;
            if (cl) {
                p_reset(c);
                return;
            }
            p_push_idle(c);
        }
        /* plain: a short read emptied the socket; TLS reads until it must wait */
        if (!c->ssl && (size_t)n < 8192) break;
    }
}

/* TLS: wait (at most max_s) for every publish connection's handshake, so a
   step's schedule does not start on connections that cannot send yet */
static void p_finish_handshakes(double max_s) {
    uint64_t end = now_ns() + (uint64_t)(max_s * 1e9);
    struct epoll_event evs[64];
    uint64_t dummy = 0;
    for (;;) {
        int pending = 0;
        for (int k = 0; k < P.nc; k++) pending += P.c[k].hs;
        if (!pending || now_ns() > end) return;
        int n = epoll_wait(P.ep, evs, 64, 10);
        for (int k = 0; k < n; k++) p_on_event(&P.c[evs[k].data.u64], evs[k].events, &dummy);
    }
}

static void pub_publish(const cmd_t *m, int res_fd) {
    /* this process sends global message indexes i = wid, wid+P, ... of [0, count) */
    res_t *r = xcalloc(1, sizeof *r);
    r->type = R_PUBDONE;
    r->step = m->step;
    r->wid = P.wid;
    P.ok = P.err = P.retries = 0;
    P.errs[0] = 0;
    {
        struct epoll_event ev0[64];
        uint64_t dummy = 0;
        for (int g = 0; g < 16; g++) {
            int n0 = epoll_wait(P.ep, ev0, 64, 0);
            if (n0 <= 0) break;
            for (int k = 0; k < n0; k++) p_on_event(&P.c[ev0[k].data.u64], ev0[k].events, &dummy);
        }
    }
    p_finish_handshakes(5);
    uint64_t t0 = m->t0;
    double per = 1e9 / m->rate;
    int64_t i = P.wid;
    uint64_t send_deadline = t0 + (uint64_t)(m->seconds * 1e9) + 5000000000ull;
    uint64_t t_first = 0, t_last = 0, t_last_resp = 0, stall_until = 0;
    int stalled = 0;
    P.stalls = 0;
    struct epoll_event evs[256];
    for (int guard = 0; guard < 100000000; guard++) {
        uint64_t now = now_ns();
        int busy = 0;
        for (int k = 0; k < P.nc; k++) busy += P.c[k].busy;
        if (i >= m->count && busy == 0) break;
        if (i < m->count && now > send_deadline) break;
        if (i >= m->count && now > send_deadline + 5000000000ull) break;
        while (i < m->count && P.nidle > 0) {
            uint64_t due = t0 + (uint64_t)((double)i * per);
            if (due > now + 20000) break; /* send up to 20 us early rather than sleep that little */
            pconn_t *c = p_pop_idle();
            if (!c) break;
            /* hybrid: the actual send time, except for messages that fell due
               while every connection was busy (server back-pressure): those
               keep their intended time, so the queueing counts as latency */
            uint64_t ts = O.ts_mode == TS_INTENDED ? due
                          : O.ts_mode == TS_ACTUAL ? now_ns()
                          : (due <= stall_until ? due : now_ns());
            uint64_t s = now_ns();
            if (!t_first) t_first = s;
            t_last = s;
            h_add(&r->h2, s > due ? s - due : 0);
            if (O.ts_mode == TS_INTENDED && due > s) ts = s; /* never stamp a future time */
            p_send(c, m->n0 + i, ts);
            i += P.nprocs;
            now = now_ns();
        }
        if (i < m->count && P.nidle == 0 && t0 + (uint64_t)((double)i * per) <= now) stalled = 1;
        struct timespec tmo = {0, 200000000};
        if (i < m->count && P.nidle > 0) {
            uint64_t due = t0 + (uint64_t)((double)i * per);
            uint64_t d = due > now ? due - now : 0;
            tmo.tv_sec = (time_t)(d / 1000000000ull);
            tmo.tv_nsec = (long)(d % 1000000000ull);
        }
        int n = epoll_pwait2(P.ep, evs, 256, &tmo, NULL);
        for (int k = 0; k < n; k++) p_on_event(&P.c[evs[k].data.u64], evs[k].events, &t_last_resp);
        if (stalled && P.nidle > 0) {
            stall_until = now_ns();
            stalled = 0;
            P.stalls++;
        }
    }
    int64_t unsent = 0;
    for (int64_t j = i; j < m->count; j += P.nprocs) unsent++;
    for (int k = 0; k < P.nc; k++)
        if (P.c[k].busy) {
            /* counted as failed, never sent again: the server may have
               committed it already, and a second copy would be delivered
               as a change of its own (a duplicate) */
            p_note("publish response timeout");
            P.c[k].retried = 1;
            p_reset(&P.c[k]);
        }
    r->a[A_OK] = P.ok;
    r->a[A_ERR] = P.err;
    r->a[A_UNSENT] = (uint64_t)unsent;
    r->a[A_T_FIRST_SEND] = t_first;
    r->a[A_T_LAST_SEND] = t_last;
    r->a[A_T_LAST_RESP] = t_last_resp;
    r->a[A_STALLS] = P.stalls;
    r->a[A_RETRIES] = P.retries;
    snprintf(r->err, sizeof r->err, "%s", P.errs);
    write_full(res_fd, r, sizeof *r);
    free(r);
}

static void pub_worker(int wid, int nprocs, int cmd_fd, int res_fd) {
    static char role[32];
    snprintf(role, sizeof role, "loadgen[pub %d]", wid);
    g_role = role;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    P.wid = wid;
    P.nprocs = nprocs;
    P.ep = epoll_create1(EPOLL_CLOEXEC);
    P.nc = O.pub_conns;
    P.c = xcalloc((size_t)P.nc, sizeof(pconn_t));
    P.idle = xcalloc((size_t)P.nc, sizeof(int));
    for (int k = 0; k < P.nc; k++) {
        P.c[k].fd = -1;
        if (p_connect(&P.c[k]) == 0) p_push_idle(&P.c[k]);
    }
    p_finish_handshakes(10);
    uint64_t hard_end = now_ns() + (uint64_t)(O.max_run * 1e9);
    for (;;) {
        struct pollfd pfd = {.fd = cmd_fd, .events = POLLIN};
        int pr = poll(&pfd, 1, 1000);
        if (now_ns() > hard_end) _exit(4);
        if (pr <= 0) continue;
        cmd_t m;
        ssize_t rr = read(cmd_fd, &m, sizeof m);
        if (rr <= 0) _exit(0);
        if (m.type == C_QUIT) _exit(0);
        if (m.type == C_PUBLISH) {
            if (P.nidle == 0) /* all connections lost earlier: retry */
                for (int k = 0; k < P.nc; k++)
                    if (P.c[k].fd < 0 && p_connect(&P.c[k]) == 0) p_push_idle(&P.c[k]);
            pub_publish(&m, res_fd);
        }
    }
}

/* ------------------------------------------------------------------ */
/* parent                                                              */
/* ------------------------------------------------------------------ */

typedef struct {
    pid_t pid;
    int cmd, res;
} child_t;
static child_t *SUBS, *PUBS;
static int NSUB, NPUB;
static volatile sig_atomic_t g_stop;

static void on_signal(int s) {
    (void)s;
    g_stop = 1;
}

static void send_cmd(child_t *ch, const cmd_t *m) { write_full(ch->cmd, m, sizeof *m); }

static void bcast(child_t *chs, int n, const cmd_t *m) {
    for (int i = 0; i < n; i++) send_cmd(&chs[i], m);
}

static res_t *gather(child_t *chs, int n, int type, double timeout_s) {
    res_t *rs = xcalloc((size_t)n, sizeof(res_t));
    uint64_t deadline = now_ns() + (uint64_t)(timeout_s * 1e9);
    for (int i = 0; i < n; i++) {
        if (read_full_deadline(chs[i].res, &rs[i], sizeof(res_t), deadline) < 0)
            die("worker %d did not answer within %.0f s", i, timeout_s);
        if (rs[i].type != type) die("worker %d answered message %d, expected %d", i, rs[i].type, type);
    }
    return rs;
}

static void shutdown_children(void) {
    cmd_t q = {.type = C_QUIT};
    if (SUBS)
        for (int i = 0; i < NSUB; i++) write(SUBS[i].cmd, &q, sizeof q);
    if (PUBS)
        for (int i = 0; i < NPUB; i++) write(PUBS[i].cmd, &q, sizeof q);
    uint64_t deadline = now_ns() + 5000000000ull;
    int left = NSUB + NPUB;
    while (left > 0 && now_ns() < deadline) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) left--;
        else if (p < 0) break;
        else usleep(20000);
    }
    for (int i = 0; SUBS && i < NSUB; i++) kill(SUBS[i].pid, SIGKILL);
    for (int i = 0; PUBS && i < NPUB; i++) kill(PUBS[i].pid, SIGKILL);
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

/* server resource sampling */
static double cpu_seconds(void) {
    double tot = 0;
    long hz = sysconf(_SC_CLK_TCK);
    for (int i = 0; i < O.n_server_pids; i++) {
        char path[64], b[2048];
        snprintf(path, sizeof path, "/proc/%d/stat", O.server_pids[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(b, 1, sizeof b - 1, f);
        fclose(f);
        b[n] = 0;
        char *p = strrchr(b, ')');
        if (!p) continue;
        /* fields after ')': state(3) ... utime(14) stime(15) */
        unsigned long ut = 0, st = 0;
        int field = 2;
        for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " ")) {
            field++;
            if (field == 14) ut = strtoul(tok, NULL, 10);
            if (field == 15) {
                st = strtoul(tok, NULL, 10);
                break;
            }
        }
        tot += (double)(ut + st) / (double)hz;
    }
    return tot;
}
static long rss_kib(void) {
    long tot = 0;
    for (int i = 0; i < O.n_server_pids; i++) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", O.server_pids[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "VmRSS:", 6)) tot += atol(line + 6);
        fclose(f);
    }
    return tot;
}

static void print_err_lines(res_t *rs, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (rs[i].err[0]) fprintf(stderr, "  %s %d: %s\n", what, i, rs[i].err);
}

typedef struct {
    long ready, failed;
    double setup_s, setup_rate;
    hist_t setup;
} ready_sum_t;

static ready_sum_t sum_ready(res_t *rs) {
    ready_sum_t s = {0};
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int i = 0; i < NSUB; i++) {
        s.ready += (long)rs[i].a[A_READY];
        s.failed += (long)rs[i].a[A_FAILED];
        if (rs[i].a[A_T_FIRST] && rs[i].a[A_T_FIRST] < t0) t0 = rs[i].a[A_T_FIRST];
        if (rs[i].a[A_T_LAST] > t1) t1 = rs[i].a[A_T_LAST];
        h_merge(&s.setup, &rs[i].h2);
    }
    s.setup_s = (t1 > t0 && t0 != UINT64_MAX) ? (double)(t1 - t0) / 1e9 : 0;
    s.setup_rate = s.setup_s > 0 ? (double)s.ready / s.setup_s : 0;
    return s;
}

typedef struct {
    uint64_t ok, err, unsent, t_first, t_last, t_last_resp, stalls, retries;
    hist_t lag;
} pub_sum_t;

static pub_sum_t run_publish(int step, int64_t n0, int64_t count, double rate) {
    cmd_t m = {.type = C_PUBLISH, .step = step, .n0 = n0, .count = count, .rate = rate,
               .seconds = (double)count / rate, .t0 = now_ns() + 20000000ull};
    bcast(PUBS, NPUB, &m);
    res_t *rs = gather(PUBS, NPUB, R_PUBDONE, m.seconds + 30);
    pub_sum_t s = {0};
    s.t_first = UINT64_MAX;
    for (int i = 0; i < NPUB; i++) {
        s.ok += rs[i].a[A_OK];
        s.err += rs[i].a[A_ERR];
        s.unsent += rs[i].a[A_UNSENT];
        s.stalls += rs[i].a[A_STALLS];
        s.retries += rs[i].a[A_RETRIES];
        if (rs[i].a[A_T_FIRST_SEND] && rs[i].a[A_T_FIRST_SEND] < s.t_first) s.t_first = rs[i].a[A_T_FIRST_SEND];
        if (rs[i].a[A_T_LAST_SEND] > s.t_last) s.t_last = rs[i].a[A_T_LAST_SEND];
        if (rs[i].a[A_T_LAST_RESP] > s.t_last_resp) s.t_last_resp = rs[i].a[A_T_LAST_RESP];
        h_merge(&s.lag, &rs[i].h2);
    }
    if (s.t_first == UINT64_MAX) s.t_first = m.t0;
    print_err_lines(rs, NPUB, "publisher");
    free(rs);
    return s;
}

typedef struct {
    uint64_t unique, dup, misrouted, badnum, first, last, dropped, frames;
    hist_t h;
} sub_sum_t;

static sub_sum_t report_step(int step) {
    cmd_t m = {.type = C_REPORT, .step = step};
    bcast(SUBS, NSUB, &m);
    res_t *rs = gather(SUBS, NSUB, R_REPORT, 30);
    sub_sum_t s = {0};
    for (int i = 0; i < NSUB; i++) {
        s.unique += rs[i].a[A_UNIQUE];
        s.dup += rs[i].a[A_DUP];
        s.misrouted += rs[i].a[A_MISROUTED];
        s.badnum += rs[i].a[A_BADNUM];
        s.dropped += rs[i].a[A_DROPPED];
        s.frames += rs[i].a[A_FRAMES];
        if (rs[i].a[A_FIRST_RECV] && (!s.first || rs[i].a[A_FIRST_RECV] < s.first)) s.first = rs[i].a[A_FIRST_RECV];
        if (rs[i].a[A_LAST_RECV] > s.last) s.last = rs[i].a[A_LAST_RECV];
        h_merge(&s.h, &rs[i].h);
    }
    print_err_lines(rs, NSUB, "subscriber worker");
    free(rs);
    return s;
}

/* --around-steps CMD: `CMD start` before the first step's first publish and
   `CMD stop` after the last step's drain, each waited for, so that a
   profiler or counter attached to the server sees the steps alone. */
static void around_steps(const char *phase) {
    if (!O.around_steps) return;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s", O.around_steps, phase);
    fflush(stdout);
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "--around-steps: `%s` exited with %d\n", cmd, rc);
}

static void usage(void) {
    fputs(
        "usage: loadgen --mode fanout|idle|dismiss|reconnect --sub-url URL [options]\n"
        "  see bench/README.md for every flag; templates take {user} {uidx} {device} {didx}\n"
        "  {token} {app} {key} {n} {ts} {id} {cursor} {epoch}\n",
        stderr);
    exit(2);
}

static void parse_rates(const char *s) {
    /* "5000" | "5000,10000,20000" | "ramp:START:STEP:MAX" */
    if (!strncmp(s, "ramp:", 5)) {
        double a, st, mx;
        if (sscanf(s + 5, "%lf:%lf:%lf", &a, &st, &mx) != 3 || a <= 0 || st <= 0 || mx < a) die("bad --rate %s", s);
        O.n_rates = 0;
        for (double r = a; r <= mx + 1e-9 && O.n_rates < MAX_STEPS; r += st) O.rates[O.n_rates++] = r;
        return;
    }
    O.n_rates = 0;
    char *d = strdup(s), *save = NULL;
    for (char *t = strtok_r(d, ",", &save); t && O.n_rates < MAX_STEPS; t = strtok_r(NULL, ",", &save)) {
        double r = atof(t);
        if (r <= 0) die("bad rate %s", t);
        O.rates[O.n_rates++] = r;
    }
    free(d);
    if (!O.n_rates) die("no rate given");
}

int main(int argc, char **argv) {
    /* defaults */
    O.mode = M_FANOUT;
    O.users = 1000;
    O.devices = 3;
    O.pub_method = "POST";
    O.ts_key = "t";
    O.n_key = "n";
    O.id_key = "id";
    O.user_prefix = "u";
    O.device_prefix = "d";
    O.app = "bench";
    O.key = "";
    O.token_ttl = 86400;
    O.duration = 10;
    O.drain = 2;
    O.max_p99_ms = 100;
    O.burst = 10;
    O.conns_per_proc = 8000;
    O.src_base = 2;
    O.connect_conc = 200;
    O.setup_timeout = 60;
    O.settle = 2;
    O.pub_conns = 32;
    O.pub_procs = 1;
    O.max_run = 900;
    O.dismiss_frame = "{\"type\":\"update\",\"ref\":\"r{n}\",\"id\":\"{id}\",\"readState\":\"read\"}";
    O.dismiss_match = "\"readState\":\"read\"";
    O.rates[0] = 5000;
    O.n_rates = 1;
    long idle_conns = -1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (die("%s needs a value", a), (char *)NULL))
        if (!strcmp(a, "--mode")) {
            const char *m = NEXT();
            if (!strcmp(m, "fanout")) O.mode = M_FANOUT;
            else if (!strcmp(m, "idle")) O.mode = M_IDLE;
            else if (!strcmp(m, "dismiss")) O.mode = M_DISMISS;
            else if (!strcmp(m, "reconnect")) O.mode = M_RECONNECT;
            else die("unknown mode %s", m);
        } else if (!strcmp(a, "--users")) O.users = atol(NEXT());
        else if (!strcmp(a, "--devices")) O.devices = atol(NEXT());
        else if (!strcmp(a, "--conns")) idle_conns = atol(NEXT());
        else if (!strcmp(a, "--sub-url")) {
            if (O.n_sub_urls >= MAX_SUB_URLS) die("too many --sub-url");
            O.sub_urls[O.n_sub_urls++] = NEXT();
        }
        else if (!strcmp(a, "--keep-going")) O.keep_going = 1;
        else if (!strcmp(a, "--url-by")) {
            const char *m = NEXT();
            if (!strcmp(m, "user")) O.url_by_user = 1;
            else if (strcmp(m, "connection")) die("--url-by takes user or connection");
        } else if (!strcmp(a, "--hello")) O.hello = NEXT();
        else if (!strcmp(a, "--resume-hello")) O.resume_hello = NEXT();
        else if (!strcmp(a, "--ready-match")) O.ready_match = NEXT();
        else if (!strcmp(a, "--sub-header")) {
            if (O.n_sub_headers >= MAX_HDRS) die("too many --sub-header");
            O.sub_headers[O.n_sub_headers++] = NEXT();
        } else if (!strcmp(a, "--pub-url")) {
            if (O.n_pub_urls >= MAX_SUB_URLS) die("too many --pub-url");
            O.pub_urls[O.n_pub_urls++] = NEXT();
        }
        else if (!strcmp(a, "--pub-method")) O.pub_method = NEXT();
        else if (!strcmp(a, "--pub-header")) {
            if (O.n_pub_headers >= MAX_HDRS) die("too many --pub-header");
            O.pub_headers[O.n_pub_headers++] = NEXT();
        } else if (!strcmp(a, "--pub-body")) O.pub_body = NEXT();
        else if (!strcmp(a, "--ts-key")) O.ts_key = NEXT();
        else if (!strcmp(a, "--n-key")) O.n_key = NEXT();
        else if (!strcmp(a, "--msg-filter")) O.msg_filter = NEXT();
        else if (!strcmp(a, "--id-key")) O.id_key = NEXT();
        else if (!strcmp(a, "--dismiss-frame")) O.dismiss_frame = NEXT();
        else if (!strcmp(a, "--dismiss-match")) O.dismiss_match = NEXT();
        else if (!strcmp(a, "--user-prefix")) O.user_prefix = NEXT();
        else if (!strcmp(a, "--device-prefix")) O.device_prefix = NEXT();
        else if (!strcmp(a, "--app")) O.app = NEXT();
        else if (!strcmp(a, "--key")) O.key = NEXT();
        else if (!strcmp(a, "--secret")) O.secret = NEXT();
        else if (!strcmp(a, "--token-ttl")) O.token_ttl = atol(NEXT());
        else if (!strcmp(a, "--rate")) parse_rates(NEXT());
        else if (!strcmp(a, "--duration")) O.duration = atof(NEXT());
        else if (!strcmp(a, "--drain")) O.drain = atof(NEXT());
        else if (!strcmp(a, "--max-p99-ms")) O.max_p99_ms = atof(NEXT());
        else if (!strcmp(a, "--burst")) O.burst = atol(NEXT());
        else if (!strcmp(a, "--conns-per-proc")) O.conns_per_proc = atol(NEXT());
        else if (!strcmp(a, "--src-base")) O.src_base = atoi(NEXT());
        else if (!strcmp(a, "--connect-concurrency")) O.connect_conc = atoi(NEXT());
        else if (!strcmp(a, "--setup-timeout")) O.setup_timeout = atof(NEXT());
        else if (!strcmp(a, "--hold")) O.hold = atof(NEXT());
        else if (!strcmp(a, "--around-steps")) O.around_steps = NEXT();
        else if (!strcmp(a, "--settle")) O.settle = atof(NEXT());
        else if (!strcmp(a, "--pub-conns")) O.pub_conns = atoi(NEXT());
        else if (!strcmp(a, "--pub-procs")) O.pub_procs = atoi(NEXT());
        else if (!strcmp(a, "--ts-mode")) {
            const char *m = NEXT();
            if (!strcmp(m, "hybrid")) O.ts_mode = TS_HYBRID;
            else if (!strcmp(m, "intended")) O.ts_mode = TS_INTENDED;
            else if (!strcmp(m, "actual")) O.ts_mode = TS_ACTUAL;
            else die("--ts-mode is hybrid, intended or actual");
        }
        else if (!strcmp(a, "--server-pids")) {
            char *d = strdup(NEXT()), *save = NULL;
            for (char *t = strtok_r(d, ",", &save); t && O.n_server_pids < MAX_PIDS; t = strtok_r(NULL, ",", &save))
                O.server_pids[O.n_server_pids++] = atoi(t);
        } else if (!strcmp(a, "--max-run")) O.max_run = atof(NEXT());
        else if (!strcmp(a, "--quiet")) O.quiet = 1;
        else if (!strcmp(a, "--ca")) O.ca = NEXT();
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage();
        else die("unknown flag %s (see bench/README.md)", a);
#undef NEXT
    }
    if (!O.n_sub_urls) usage();
    if (O.mode == M_IDLE && idle_conns > 0) { /* --conns N: N single-device users */
        O.users = (idle_conns + O.devices - 1) / O.devices;
    }
    if (O.users < 1 || O.devices < 1) die("--users and --devices must be >= 1");
    if (O.mode == M_DISMISS && O.devices < 2) die("dismiss needs --devices >= 2");
    if (O.mode != M_IDLE && !O.n_pub_urls) die("--pub-url is required for this mode");
    if (O.conns_per_proc < 1 || O.pub_conns < 1 || O.pub_procs < 1 || O.connect_conc < 1) die("bad process/connection counts");
    if (O.duration <= 0 || O.duration > 3600 || O.max_run <= 0 || O.max_run > 7200) die("bad --duration/--max-run");
    if (O.mode == M_DISMISS || O.mode == M_RECONNECT) {
        if (!O.ready_match) O.ready_match = "\"type\":\"welcome\"";
    }
    O.conns = O.users * O.devices;
    int sub_tls = 0;
    for (int i = 0; i < O.n_sub_urls; i++) {
        parse_url(O.sub_urls[i], &SUB_URLS[i], 1);
        sub_tls |= SUB_URLS[i].tls;
    }
    for (int i = 0; i < O.n_pub_urls; i++) {
        parse_url(O.pub_urls[i], &PUB_URLS[i], 0);
        sub_tls |= PUB_URLS[i].tls;
    }
    if (sub_tls) tls_init();
    raise_nofile();
    signal(SIGPIPE, SIG_IGN);
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* message schedule: step s covers [nstart[s], nstart[s]+count[s]) */
    int64_t nstart[MAX_STEPS], ncount[MAX_STEPS];
    int nsteps = 0;
    int64_t total = 0;
    if (O.mode == M_FANOUT) {
        for (int s = 0; s < O.n_rates; s++) {
            nstart[s] = total;
            ncount[s] = (int64_t)llround(O.rates[s] * O.duration);
            if (ncount[s] < 1) ncount[s] = 1;
            total += ncount[s];
        }
        nsteps = O.n_rates;
    } else if (O.mode == M_DISMISS) {
        nstart[0] = 0;
        ncount[0] = O.users;
        total = O.users;
        nsteps = 1;
    } else if (O.mode == M_RECONNECT) {
        nstart[0] = 0;
        ncount[0] = O.users * O.burst;
        total = ncount[0];
        nsteps = 1;
    }
    if (total > 2000000000LL) die("too many messages (%" PRId64 ")", total);

    /* workers: split users so each holds <= conns_per_proc connections */
    long upw = O.conns_per_proc / O.devices;
    if (upw < 1) upw = 1;
    NSUB = (int)((O.users + upw - 1) / upw);
    if (NSUB > 250 - O.src_base) die("too many worker processes (%d)", NSUB);
    upw = (O.users + NSUB - 1) / NSUB;
    NPUB = (O.mode == M_IDLE) ? 0 : O.pub_procs;
    SUBS = xcalloc((size_t)NSUB, sizeof(child_t));
    PUBS = xcalloc((size_t)(NPUB ? NPUB : 1), sizeof(child_t));

    long rss0 = rss_kib();
    double cpu_setup0 = cpu_seconds();
    fflush(NULL);
    for (int k = 0; k < NSUB + NPUB; k++) {
        int c2w[2], w2p[2];
        if (pipe2(c2w, O_CLOEXEC) < 0 || pipe2(w2p, O_CLOEXEC) < 0) die("pipe: %s", strerror(errno));
        pid_t pid = fork();
        if (pid < 0) die("fork: %s", strerror(errno));
        if (pid == 0) {
            close(c2w[1]);
            close(w2p[0]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            for (int j = 0; j < k; j++) { /* drop siblings' pipes */
                child_t *o = j < NSUB ? &SUBS[j] : &PUBS[j - NSUB];
                close(o->cmd);
                close(o->res);
            }
            if (k < NSUB) {
                long u0 = k * upw, u1 = u0 + upw;
                if (u1 > O.users) u1 = O.users;
                sub_worker(k, u0, u1, c2w[0], w2p[1], total > 0 ? total : 1);
            } else pub_worker(k - NSUB, NPUB, c2w[0], w2p[1]);
            _exit(0);
        }
        close(c2w[0]);
        close(w2p[1]);
        child_t *ch = k < NSUB ? &SUBS[k] : &PUBS[k - NSUB];
        ch->pid = pid;
        ch->cmd = c2w[1];
        ch->res = w2p[0];
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    atexit(shutdown_children);

    const char *mname[] = {"fanout", "idle", "dismiss", "reconnect"};
    if (!O.quiet)
        printf("mode %s: %ld users x %ld devices = %ld connections in %d processes (src 127.0.0.%d..%d), %d publisher process(es)\n",
               mname[O.mode], O.users, O.devices, O.conns, NSUB, O.src_base, O.src_base + NSUB - 1, NPUB);

    res_t *rr = gather(SUBS, NSUB, R_READY, O.setup_timeout + 30);
    ready_sum_t rs = sum_ready(rr);
    print_err_lines(rr, NSUB, "subscriber worker");
    free(rr);
    double cpu_setup1 = cpu_seconds();
    printf("setup: %ld of %ld ready, %ld failed in %.2f s (%.0f connections/s), handshake p50 %.2f ms p99 %.2f ms max %.2f ms\n",
           rs.ready, O.conns, rs.failed, rs.setup_s, rs.setup_rate, ms(h_pct(&rs.setup, .5)), ms(h_pct(&rs.setup, .99)),
           ms(rs.setup.max));
    /* the servers' summed RSS once every subscriber is ready (0 without --server-pids) */
    long rss_ready = O.n_server_pids ? rss_kib() : 0;
    printf("RESULT mode=%s phase=setup conns=%ld ready=%ld failed=%ld setup_s=%.3f setup_rate=%.0f hs_p50_ms=%.3f hs_p99_ms=%.3f server_cpu_s=%.3f rss_before_kib=%ld rss_ready_kib=%ld\n",
           mname[O.mode], O.conns, rs.ready, rs.failed, rs.setup_s, rs.setup_rate, ms(h_pct(&rs.setup, .5)),
           ms(h_pct(&rs.setup, .99)), cpu_setup1 - cpu_setup0, rss0, rss_ready);
    int exit_code = (rs.failed > 0) ? 1 : 0;
    if (rs.ready == 0) {
        fprintf(stderr, "no subscriber became ready: stopping\n");
        return 1;
    }

    if (O.mode == M_IDLE) {
        if (O.n_server_pids) {
            uint64_t end = now_ns() + (uint64_t)(O.settle * 1e9);
            while (now_ns() < end && !g_stop) usleep(50000);
            long rss1 = rss_kib();
            double per = rs.ready ? (double)(rss1 - rss0) * 1024.0 / (double)rs.ready : 0;
            printf("server RSS: %ld KiB before, %ld KiB with %ld connections: %.0f bytes per connection\n", rss0, rss1,
                   rs.ready, per);
            printf("RESULT mode=idle phase=rss rss_before_kib=%ld rss_after_kib=%ld conns=%ld bytes_per_conn=%.0f\n", rss0,
                   rss1, rs.ready, per);
        }
        printf("READY %ld\n", rs.ready);
        fflush(stdout);
        uint64_t end = now_ns() + (uint64_t)(O.hold * 1e9);
        while (now_ns() < end && !g_stop) usleep(50000);
        return exit_code;
    }

    if (O.mode == M_FANOUT) {
        double best_dps = 0, best_rate = 0;
        around_steps("start");
        for (int s = 0; s < nsteps && !g_stop; s++) {
            cmd_t st = {.type = C_STEP, .step = s, .n0 = nstart[s], .count = ncount[s]};
            bcast(SUBS, NSUB, &st);
            double cpu0 = cpu_seconds();
            pub_sum_t p = run_publish(s, nstart[s], ncount[s], O.rates[s]);
            uint64_t end = now_ns() + (uint64_t)(O.drain * 1e9);
            while (now_ns() < end) usleep(20000);
            double cpu1 = cpu_seconds();
            sub_sum_t r = report_step(s);
            uint64_t expected = p.ok * (uint64_t)O.devices;
            int64_t lost = (int64_t)expected - (int64_t)r.unique;
            double span = r.last > p.t_first ? (double)(r.last - p.t_first) / 1e9 : 0;
            double dps = span > 0 ? (double)r.unique / span : 0;
            double pub_span = p.t_last > p.t_first ? (double)(p.t_last - p.t_first) / 1e9 : 0;
            double pub_rate = pub_span > 0 ? (double)(p.ok + p.err) / pub_span : 0;
            double cpu = cpu1 - cpu0;
            double cpu_pm = r.unique ? cpu / ((double)r.unique / 1e6) : 0;
            uint64_t p50 = h_pct(&r.h, .5), p99 = h_pct(&r.h, .99), p999 = h_pct(&r.h, .999);
            int ok = lost <= 0 && p.err == 0 && p.unsent == 0 && ms(p99) <= O.max_p99_ms && r.dup == 0 &&
                     pub_rate >= 0.95 * O.rates[s];
            printf("step %d: target %.0f publishes/s x %.1f s -> published %" PRIu64 " ok, %" PRIu64 " failed, %" PRIu64
                   " unsent (%.0f/s achieved; send lag p99 %.3f ms max %.3f ms; %" PRIu64 " stalls on busy connections; %" PRIu64
                   " sent again after the server closed a keep-alive connection unanswered)\n",
                   s, O.rates[s], O.duration, p.ok, p.err, p.unsent, pub_rate, ms(h_pct(&p.lag, .99)), ms(p.lag.max), p.stalls,
                   p.retries);
            printf("  deliveries %" PRIu64 " of %" PRIu64 " expected (%.0f/s), lost %" PRId64 ", duplicates %" PRIu64
                   ", misrouted %" PRIu64 ", unparsed %" PRIu64 ", dropped connections %" PRIu64 "\n",
                   r.unique, expected, dps, lost > 0 ? lost : 0, r.dup, r.misrouted, r.badnum, r.dropped);
            printf("  latency ms: p50 %.3f  p99 %.3f  p99.9 %.3f  max %.3f  mean %.3f\n", ms(p50), ms(p99), ms(p999),
                   ms(r.h.max), r.h.n ? ms(r.h.sum / r.h.n) : 0);
            if (O.n_server_pids)
                printf("  server CPU %.2f s over the step -> %.2f CPU s per million deliveries\n", cpu, cpu_pm);
            printf("RESULT mode=fanout step=%d target_rate=%.0f pub_rate=%.0f published=%" PRIu64 " pub_errors=%" PRIu64
                   " unsent=%" PRIu64 " expected=%" PRIu64 " delivered=%" PRIu64 " dps=%.0f lost=%" PRId64 " dup=%" PRIu64
                   " p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f server_cpu_s=%.3f cpu_s_per_m=%.3f ok=%d\n",
                   s, O.rates[s], pub_rate, p.ok, p.err, p.unsent, expected, r.unique, dps, lost > 0 ? lost : 0, r.dup,
                   ms(p50), ms(p99), ms(p999), ms(r.h.max), cpu, cpu_pm, ok);
            if (ok && dps > best_dps) {
                best_dps = dps;
                best_rate = O.rates[s];
            }
            if (!ok) {
                exit_code = exit_code ? exit_code : (nsteps > 1 ? 0 : 1);
                if (nsteps > 1 && O.keep_going) {
                    printf("  step not passed (--keep-going: on to the next)\n");
                } else if (nsteps > 1) {
                    printf("  stopping the ramp: %s\n",
                           ms(p99) > O.max_p99_ms ? "p99 over the limit"
                           : lost > 0             ? "deliveries lost"
                           : p.err || p.unsent    ? "publishes failed"
                           : r.dup                ? "duplicates"
                                                  : "publisher could not hold the rate");
                    break;
                }
            }
        }
        around_steps("stop");
        if (nsteps > 1) {
            printf("saturation: max sustained %.0f deliveries/s (at %.0f publishes/s, p99 <= %.0f ms, no loss)\n", best_dps,
                   best_rate, O.max_p99_ms);
            printf("RESULT mode=saturation max_dps=%.0f at_rate=%.0f\n", best_dps, best_rate);
        }
        return exit_code;
    }

    if (O.mode == M_DISMISS) {
        cmd_t st = {.type = C_STEP, .step = 0, .n0 = 0, .count = O.users};
        bcast(SUBS, NSUB, &st);
        double rate = O.rates[0];
        pub_sum_t p = run_publish(0, 0, O.users, rate);
        uint64_t end = now_ns() + (uint64_t)(O.drain * 1e9);
        while (now_ns() < end) usleep(20000);
        sub_sum_t r = report_step(0);
        printf("seed: %" PRIu64 " notifications published (%" PRIu64 " failed), %" PRIu64 " of %" PRIu64
               " deliveries, p99 %.3f ms\n",
               p.ok, p.err, r.unique, p.ok * (uint64_t)O.devices, ms(h_pct(&r.h, .99)));
        cmd_t dm = {.type = C_DISMISS, .rate = rate, .seconds = O.drain + 5};
        bcast(SUBS, NSUB, &dm);
        res_t *ds = gather(SUBS, NSUB, R_DISMISS, (double)O.users / rate + O.drain + 30);
        hist_t h = {0};
        uint64_t sent = 0, complete = 0, received = 0, expected = 0, noid = 0;
        for (int i = 0; i < NSUB; i++) {
            sent += ds[i].a[A_D_SENT];
            complete += ds[i].a[A_D_COMPLETE];
            received += ds[i].a[A_D_RECEIVED];
            expected += ds[i].a[A_D_EXPECTED];
            noid += ds[i].a[A_D_NOID];
            h_merge(&h, &ds[i].h);
        }
        print_err_lines(ds, NSUB, "subscriber worker");
        free(ds);
        printf("dismiss: %" PRIu64 " updates sent at %.0f/s (%" PRIu64 " users without a known id), %" PRIu64 " of %" PRIu64
               " other-device changes received, %" PRIu64 " users complete\n",
               sent, rate, noid, received, expected, complete);
        printf("  dismiss-to-other-device latency ms: p50 %.3f  p99 %.3f  p99.9 %.3f  max %.3f\n", ms(h_pct(&h, .5)),
               ms(h_pct(&h, .99)), ms(h_pct(&h, .999)), ms(h.max));
        printf("RESULT mode=dismiss sent=%" PRIu64 " received=%" PRIu64 " expected=%" PRIu64 " missing=%" PRIu64
               " p50_ms=%.3f p99_ms=%.3f p999_ms=%.3f max_ms=%.3f\n",
               sent, received, expected, expected > received ? expected - received : 0, ms(h_pct(&h, .5)),
               ms(h_pct(&h, .99)), ms(h_pct(&h, .999)), ms(h.max));
        return (expected == received && noid == 0 && exit_code == 0) ? 0 : 1;
    }

    /* reconnect */
    {
        cmd_t dc = {.type = C_DISCONNECT};
        bcast(SUBS, NSUB, &dc);
        free(gather(SUBS, NSUB, R_DISCONNECTED, 30));
        cmd_t st = {.type = C_STEP, .step = 0, .n0 = 0, .count = ncount[0]};
        bcast(SUBS, NSUB, &st);
        pub_sum_t p = run_publish(0, 0, ncount[0], O.rates[0]);
        printf("while disconnected: %" PRIu64 " notifications published (%" PRIu64 " failed, %" PRIu64 " unsent)\n", p.ok,
               p.err, p.unsent);
        cmd_t rc = {.type = C_RECONNECT};
        uint64_t t0 = now_ns();
        bcast(SUBS, NSUB, &rc);
        res_t *rr2 = gather(SUBS, NSUB, R_RECONNECTED, O.setup_timeout + 30);
        ready_sum_t r2 = sum_ready(rr2);
        uint64_t t1 = 0;
        for (int i = 0; i < NSUB; i++)
            if (rr2[i].a[A_T_LAST] > t1) t1 = rr2[i].a[A_T_LAST];
        print_err_lines(rr2, NSUB, "subscriber worker");
        free(rr2);
        sub_sum_t r = report_step(0);
        uint64_t expected = p.ok * (uint64_t)O.devices;
        double wall = t1 > t0 ? (double)(t1 - t0) / 1e9 : 0;
        printf("reconnect: %ld of %ld devices resumed with catch-up and welcome in %.3f s (%.0f/s), per device p50 %.2f ms p99 %.2f ms max %.2f ms\n",
               r2.ready, O.conns, wall, wall > 0 ? (double)r2.ready / wall : 0, ms(h_pct(&r2.setup, .5)),
               ms(h_pct(&r2.setup, .99)), ms(r2.setup.max));
        printf("  catch-up: %" PRIu64 " of %" PRIu64 " missed notifications received, missing %" PRId64 ", duplicates %" PRIu64 "\n",
               r.unique, expected, (int64_t)expected - (int64_t)r.unique, r.dup);
        printf("RESULT mode=reconnect devices=%ld resumed=%ld failed=%ld wall_s=%.3f p50_ms=%.3f p99_ms=%.3f max_ms=%.3f expected=%" PRIu64
               " received=%" PRIu64 " missing=%" PRId64 " dup=%" PRIu64 "\n",
               O.conns, r2.ready, r2.failed, wall, ms(h_pct(&r2.setup, .5)), ms(h_pct(&r2.setup, .99)), ms(r2.setup.max),
               expected, r.unique, (int64_t)expected - (int64_t)r.unique, r.dup);
        return (r2.failed == 0 && r.unique == expected) ? exit_code : 1;
    }
}
