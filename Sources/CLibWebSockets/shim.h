// The C side of Herald's transport: libwebsockets plus the few socket calls
// Swift cannot reach (accept4) or spell (unions, LWS_PRE).
#include <libwebsockets.h>
#include <ev.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>

static const int herald_lws_pre = LWS_PRE;

// A listening socket that other threads may bind to the same port too
// (SO_REUSEPORT): the kernel spreads connections over the service loops.
// Returns the fd, or -errno. *bound receives the port actually bound.
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
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
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

// Watches a listening socket for readability through lws (as a raw file).
static inline struct lws *herald_adopt_listener(struct lws_vhost *vh, int fd, const char *protocol) {
    lws_sock_file_fd_type u;
    u.filefd = fd;
    return lws_adopt_descriptor_vhost(vh, LWS_ADOPT_RAW_FILE_DESC, u, protocol, NULL);
}

// A repeating lws timer that carries a pointer back to its owner.
struct herald_tick {
    lws_sorted_usec_list_t sul;
    void *owner;
};
