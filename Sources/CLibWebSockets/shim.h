// The C side of Herald's transport: libwebsockets plus the few socket calls
// Swift cannot reach (accept4) or spell (unions, packed epoll events).
#include <libwebsockets.h>
#include <ev.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <string.h>

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

// Watches a descriptor for readability through lws (as a raw file): lws
// reads nothing from it.
static inline struct lws *herald_watch_fd(struct lws_vhost *vh, int fd, const char *protocol) {
    lws_sock_file_fd_type u;
    u.filefd = fd;
    return lws_adopt_descriptor_vhost(vh, LWS_ADOPT_RAW_FILE_DESC, u, protocol, NULL);
}

// Serves an accepted socket as a raw stream of bytes (no lws HTTP parsing).
// On failure lws has closed the socket.
static inline struct lws *herald_adopt_raw_socket(struct lws_vhost *vh, int fd, const char *protocol) {
    lws_sock_file_fd_type u;
    u.sockfd = fd;
    return lws_adopt_descriptor_vhost(vh, LWS_ADOPT_SOCKET, u, protocol, NULL);
}

// Accepted sockets whose first bytes have not come yet wait in an epoll set
// of their own, which lws watches like the listener. Edge-triggered: a
// socket holding too few bytes to tell wakes the loop again only when more
// arrive. Removed from the set before lws adopts them, so no registration
// outlives its socket.
static inline int herald_waitset_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

static inline int herald_waitset_add(int set, int fd) {
    struct epoll_event e;
    memset(&e, 0, sizeof e);
    e.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    e.data.fd = fd;
    return epoll_ctl(set, EPOLL_CTL_ADD, fd, &e);
}

static inline void herald_waitset_remove(int set, int fd) { epoll_ctl(set, EPOLL_CTL_DEL, fd, NULL); }

// Fills fds with up to max (at most 64) sockets of the set that got bytes
// or were closed, without waiting; returns how many.
static inline int herald_waitset_ready(int set, int *fds, int max) {
    struct epoll_event ev[64];
    int n = epoll_wait(set, ev, max < 64 ? max : 64, 0);
    for (int i = 0; i < n; i++) fds[i] = ev[i].data.fd;
    return n;
}

// A repeating lws timer that carries a pointer back to its owner.
struct herald_tick {
    lws_sorted_usec_list_t sul;
    void *owner;
};
