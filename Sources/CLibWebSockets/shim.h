// The C side of Herald's transport: libwebsockets plus the few socket calls
// Swift cannot reach (accept4, signalfd, prctl) or spell (unions, OpenSSL's macros).
#include <libwebsockets.h>
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <ev.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>

// LWS_PRE is a function-like macro Swift cannot import: the room lws_write
// needs before a payload (HeraldClient frames through lws).
static const size_t herald_lws_pre = LWS_PRE;

// The gateway's one listening socket, which every service loop watches and
// accepts from. No SO_REUSEPORT: a second gateway on the port fails with
// EADDRINUSE instead of silently sharing it (the kernel would split
// connections between two unrelated gateways). Returns the fd, or -errno.
// *bound receives the port actually bound.
static inline int herald_listen(const char *host, int port, int *bound) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 4096) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *bound = ntohs(sa.sin_port);
    return fd;
}

// The port a listening socket is bound to, or -1 if fd is not an IPv4
// socket that listens (a worker checks the descriptor it was handed).
static inline int herald_listening_port(int fd) {
    int listening = 0;
    socklen_t n = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) < 0 || !listening) return -1;
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sin_family != AF_INET) return -1;
    return ntohs(sa.sin_port);
}

// For `herald serve --workers N`: the supervisor waits for signals (blocked
// in every thread) on a descriptor, beside its workers' pipes, in one
// poll. Swift cannot reach signalfd.h, nor call prctl (variadic).
static inline int herald_signalfd(const sigset_t *set) { return signalfd(-1, set, SFD_CLOEXEC | SFD_NONBLOCK); }

// The number of the next signal on a herald_signalfd descriptor, 0 if none.
static inline int herald_read_signal(int fd) {
    struct signalfd_siginfo si;
    return read(fd, &si, sizeof si) == (ssize_t)sizeof si ? (int)si.ssi_signo : 0;
}

// A worker asks for SIGTERM when its supervisor dies, however it dies (so
// a kill -9 of the supervisor leaves no orphan serving the port). False if
// the supervisor is already gone (the worker was re-parented before this).
static inline int herald_die_with_parent(pid_t parent) {
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) return 0;
    return getppid() == parent;
}

// Accepts one connection, non-blocking, with TCP_NODELAY (lws sets it only
// on sockets it accepts itself). Returns the fd or -1 (errno set).
static inline int herald_accept(int listen_fd) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

// Watches a descriptor for readability through lws (as a raw file): lws
// reads nothing from it.
static inline struct lws *herald_watch_fd(struct lws_vhost *vh, int fd, const char *protocol) {
    lws_sock_file_fd_type u;
    u.filefd = fd;
    return lws_adopt_descriptor_vhost(vh, LWS_ADOPT_RAW_FILE_DESC, u, protocol, NULL);
}

// Serves an accepted socket as a raw stream of bytes (no lws HTTP parsing),
// through a TLS session when `tls` (lws does the handshake and reads).
// On failure lws has closed the socket.
static inline struct lws *herald_adopt_raw_socket(struct lws_vhost *vh, int fd, const char *protocol, int tls) {
    lws_sock_file_fd_type u;
    u.sockfd = fd;
    return lws_adopt_descriptor_vhost(vh, LWS_ADOPT_SOCKET | (tls ? LWS_ADOPT_ALLOW_SSL : 0), u, protocol, NULL);
}

// Herald writes TLS records itself (SSL_write), one call per drain like
// send(): partial writes let it see what the socket took, and a retry may
// come from another buffer (lws's, for a tail it holds).
static inline void herald_tls_prepare(SSL_CTX *ctx) {
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

// Loads a certificate chain and its key into ctx; 0 on success, else the
// OpenSSL error text in `error`.
static inline int herald_tls_load(SSL_CTX *ctx, const char *cert, const char *key, char *error, size_t size) {
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) == 1 &&
        SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1 &&
        SSL_CTX_check_private_key(ctx) == 1) return 0;
    ERR_error_string_n(ERR_get_error(), error, size);
    return -1;
}

// Puts src's certificate, chain and key in dst (both loaded by
// herald_tls_load): a reload reads the files once, then every loop takes
// the same objects.
static inline int herald_tls_copy(SSL_CTX *dst, SSL_CTX *src) {
    STACK_OF(X509) *chain = NULL;
    SSL_CTX_get0_chain_certs(src, &chain);
    return SSL_CTX_use_certificate(dst, SSL_CTX_get0_certificate(src)) == 1 &&
           SSL_CTX_use_PrivateKey(dst, SSL_CTX_get0_privatekey(src)) == 1 &&
           SSL_CTX_set1_chain(dst, chain) == 1 ? 0 : -1;
}

// Writes up to n bytes to a TLS session: the count written, 0 when the
// socket is full (retry when writable), -1 when the session failed.
static inline int herald_tls_write(SSL *ssl, const void *bytes, int n) {
    ERR_clear_error();
    int r = SSL_write(ssl, bytes, n);
    if (r > 0) return r;
    int e = SSL_get_error(ssl, r);
    return e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? 0 : -1;
}

// A repeating lws timer that carries a pointer back to its owner.
struct herald_tick {
    lws_sorted_usec_list_t sul;
    void *owner;
};
