import Glibc
import HeraldCore
import HeraldCurl

/// The thread behind an `HTTP2Client`: poll() over its connections' sockets
/// and a pipe that `thread` writes to when a request comes in or the
/// client stops. Requests, completions and every connection's state stay on it.
final class HTTP2Loop: @unchecked Sendable {  // the pipe is closed only after `thread` stopped; `connections` and `draining` only on the loop thread (`owner` checks it where requests start and at the end)
    let thread: ClientThread
    /// The pipe's ends: the loop polls the one, `thread` writes a byte to the other.
    private let wake: Int32, waker: Int32
    private let tls: TLSContext
    private let maxInFlight: Int
    private let limits: HTTP2Connection.Limits
    private var owner: ThreadOwner { thread.owner }
    /// One per origin, while it can take new streams.
    private var connections: [Origin: HTTP2Connection] = [:]
    /// Those a GOAWAY closed to new streams, until the server has answered the streams it took.
    private var draining: [HTTP2Connection] = []
    private var all: [HTTP2Connection] { Array(connections.values) + draining }

    init(caFile: String?, maxInFlight: Int, limits: HTTP2Connection.Limits) throws {
        tls = try TLSContext(caFile: caFile)
        var ends: [Int32] = [0, 0]
        guard pipe(&ends) == 0 else { throw CurlFailure.other("pipe: " + String(cString: strerror(errno))) }
        // Non-blocking both: a full pipe already wakes the loop, and the loop drains it without waiting.
        for fd in ends { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        wake = ends[0]; waker = ends[1]
        self.maxInFlight = maxInFlight; self.limits = limits
        // Under the thread's lock: the loop closes the pipe only after it saw it stopping.
        let fd = ends[1]
        thread = ClientThread("HTTP/2 loop") {
            var one: UInt8 = 1
            _ = write(fd, &one, 1)
        }
    }

    func start(name: String) { thread.start(name: name) { [self] in run() } }

    private func run() {
        var fds: [pollfd] = []
        var polled: [HTTP2Connection] = []
        while let batch = thread.take(maxInFlight: maxInFlight) {
            for w in batch { begin(w) }
            for c in all {
                c.flush()
                settle(c)
            }
            fds = [pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
            polled = all
            fds += polled.map { pollfd(fd: $0.socket, events: $0.events, revents: 0) }
            poll(&fds, nfds_t(fds.count), thread.hasWork(maxInFlight: maxInFlight) ? 0 : pollTimeout())
            if fds[0].revents != 0 {
                var bytes = [UInt8](repeating: 0, count: 256)
                while read(wake, &bytes, bytes.count) > 0 {}
            }
            for (c, p) in zip(polled, fds.dropFirst()) where p.revents != 0 {
                c.handle(p.revents)
                settle(c)
            }
            let now = ContinuousClock.now
            for c in all {
                c.tick(now)
                settle(c)
            }
        }
        finish()
    }

    /// Milliseconds to the connections' next deadline, rounded up; -1 for none.
    private func pollTimeout() -> Int32 {
        guard let next = all.compactMap(\.nextDeadline).min() else { return -1 }
        let ms = ((next - .now) / .milliseconds(1)).rounded(.up)
        return Int32(min(max(0, ms), 60_000))
    }

    /// Starts `w` on its origin's connection, or completes it when it cannot go.
    private func begin(_ w: ClientThread.Waiting) {
        owner.preconditionCurrent()
        let now = ContinuousClock.now
        let target = w.wireTime(now: now).flatMap { wire in
            w.request.refusal(plainHTTP: false).map { .failure(.refused($0)) } ?? HTTP2Exchange.target(w.request.url).map { ($0, $1, wire) }
        }
        switch target {
        case .failure(let f): thread.complete(w.completion, .failure(f))
        case .success(let (origin, path, wire)):
            start(HTTP2Exchange(w.request, completion: w.completion, origin: origin, path: path, deadline: now + wire))
        }
    }

    private func start(_ ex: HTTP2Exchange) {
        let c: HTTP2Connection
        if let open = connections[ex.origin], open.isOpen {
            c = open
        } else {
            if let closing = connections.removeValue(forKey: ex.origin), closing.state != .closed { draining.append(closing) }
            do {
                c = try HTTP2Connection(ex.origin, tls: tls, limits: limits)
            } catch {
                return thread.complete(ex.completion, .failure(error))
            }
            connections[ex.origin] = c
        }
        c.add(ex)
        settle(c)
    }

    /// Takes what `c` ended: it forgets a closed connection, sends again on
    /// another what `c` did not, completes the rest.
    private func settle(_ c: HTTP2Connection) {
        if c.state == .closed {
            if connections[c.origin] === c { connections[c.origin] = nil }
            draining.removeAll { $0 === c }
        }
        let unsent = c.unsent, finished = c.finished
        c.unsent = []
        c.finished = []
        for ex in unsent {
            ex.restart()
            start(ex)
        }
        for (ex, result) in finished { thread.complete(ex.completion, result) }
    }

    private func finish() {
        owner.preconditionCurrent()
        for c in all {
            c.close(.stopped)
            settle(c)
        }
        thread.stopWaiting()
        Glibc.close(wake)
        Glibc.close(waker)
    }
}
