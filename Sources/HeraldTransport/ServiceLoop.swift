import CLibWebSockets
import Foundation
import HeraldCore
import HeraldGateway
import HeraldPorts
import Synchronization

/// One libwebsockets context on its own thread. Every loop watches the
/// gateway's one listening socket and accepts from it: whichever loop is
/// free takes the next connection.
///
/// Threads: everything but `post` runs on the loop's thread. `post` may be
/// called from any thread; it appends to the inbox and wakes the loop with
/// `lws_cancel_service`, the one lws call that is safe from other threads.
/// The context pointer is read under the inbox lock, so a wake-up never races
/// `lws_context_destroy`.
final class ServiceLoop: LoopExecutor, @unchecked Sendable {  // loop-thread state, checked through its shard; `post` takes the inbox lock
    struct Inbox {
        var jobs: [@Sendable () -> Void] = []
        /// The context's address (0 when none): an integer, so it is Sendable.
        var context: UInt = 0
    }

    let index: Int
    let gateway: Gateway
    let admission: Admission
    let eventLoop: EventLoopKind
    var shard: Shard!
    /// The loop thread's owner (the shard's), which every connection's entry points check.
    var owner: ThreadOwner { shard.thread }
    private let inbox = Locked(Inbox())
    private var context: OpaquePointer?
    private var evLoop: OpaquePointer?
    let tls: TLSFiles?
    /// The TLS context of this loop's vhost (lws made it), while TLS is on.
    var tlsContext: OpaquePointer?
    private var listenFd: Int32
    private var listener: OpaquePointer?
    /// Held open so that when the process runs out of descriptors one can
    /// be freed to accept and close a connection: left in the backlog it
    /// would keep the listener readable, and the loop spinning.
    private var spare: Int32 = -1
    private var acceptPaused = false
    private var lastRefusalLog: Millis = 0
    private var tick: UnsafeMutablePointer<herald_tick>?
    private var thread: Thread?
    private let ready = DispatchSemaphore(value: 0)
    private let exited = DispatchSemaphore(value: 0)
    private var startError: String?
    private let running = Atomic<Bool>(true)

    /// Open connections on this loop, for shutdown.
    var webSockets: [ObjectIdentifier: WebSocketConnection] = [:]
    var httpConnections: [ObjectIdentifier: HTTPConnection] = [:]
    /// Past `beginShutdown`: answers close their connections.
    private(set) var shuttingDown = false
    /// True while the inbox is being drained: output then waits for the end
    /// of the drain (`flush`), so a connection writes once per drain, and
    /// directly when its socket has room, without a writable round trip
    /// (two epoll_ctl calls).
    private var draining = false
    private var flushAfterDrain: [Flushable] = []
    /// HTTP connections that set a `deadline`, and the earliest time one of
    /// those may have passed (`Clock.ticks`). One that has none left stays
    /// until the next check, so that a kept-alive connection costs no table
    /// update per request.
    private var deadlines: [ObjectIdentifier: HTTPConnection] = [:]
    private var nextDeadlineCheck = Millis.max

    /// Asks for `c` to write: at the end of the drain (once), or, outside a
    /// drain, from the socket's writable callback.
    func requestWrite(_ c: Flushable, socket: ConnectionSocket, queued: inout Bool) {
        owner.preconditionCurrent()
        if draining {
            if !queued {
                queued = true
                flushAfterDrain.append(c)
            }
        } else {
            socket.wantWritable()
        }
    }
    /// Reused for WebSocket output: framed messages, up to about `outputLimit`
    /// bytes per `send()`.
    var output: [UInt8] = []
    static let outputLimit = 256 * 1024

    init(index: Int, listenFd: Int32, gateway: Gateway, admission: Admission, eventLoop: EventLoopKind, tls: TLSFiles?) {
        self.index = index; self.listenFd = listenFd; self.gateway = gateway; self.admission = admission
        self.eventLoop = eventLoop; self.tls = tls
    }

    func post(_ job: @escaping @Sendable () -> Void) {
        inbox.withLock { box in
            box.jobs.append(job)
            if box.jobs.count == 1, let ctx = OpaquePointer(bitPattern: box.context) { lws_cancel_service(ctx) }
        }
    }

    /// Creates the context and starts the thread; throws with the reason if
    /// that failed.
    func start() throws {
        spare = open("/dev/null", O_RDONLY | O_CLOEXEC)
        let t = Thread { [self] in
            nameCurrentThread("herald-loop-\(index)")
            run()
        }
        thread = t
        t.start()
        ready.wait()
        if let e = startError { throw ServerError(e) }
    }

    private func run() {
        shard.thread.claim()
        var evLoop: OpaquePointer? = nil
        let foreign = UnsafeMutablePointer<UnsafeMutableRawPointer?>.allocate(capacity: 1)
        defer { foreign.deallocate() }
        if eventLoop == .libev {
            evLoop = ev_loop_new(UInt32(EVFLAG_AUTO))
            foreign.pointee = UnsafeMutableRawPointer(evLoop)
        }
        self.evLoop = evLoop
        guard let ctx = Protocols.createContext(owner: self, gateway: gateway, eventLoop: eventLoop,
                                                foreignLoop: evLoop == nil ? nil : foreign, tls: tls) else {
            startError = tls == nil ? "libwebsockets could not create a context"
                : "libwebsockets could not create a TLS context (check --tls-cert and --tls-key)"
            ready.signal()
            return
        }
        context = ctx
        let vh = lws_get_vhost_by_name(ctx, "default")
        listener = herald_watch_fd(vh, listenFd, Protocols.listenName)
        guard listener != nil else {
            startError = "libwebsockets could not watch the listening socket"
            lws_context_destroy(ctx)
            ready.signal()
            return
        }
        let address = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(ctx)))
        inbox.withLock { $0.context = address }
        scheduleTick()
        ready.signal()
        if let evLoop {
            // Runs until drainInbox breaks it at shutdown. The context is not
            // destroyed then: the process is about to exit, every connection
            // has been closed politely, and lws 4.1.6 tears foreign loops
            // down only from inside them.
            ev_run(evLoop, 0)
        } else {
            // poll(): lws_service returns after each wake-up.
            while running.load(ordering: .relaxed) {
                if lws_service(ctx, 0) != 0 { break }
            }
            inbox.withLock { $0.context = 0 }
            lws_context_destroy(ctx)
        }
        tick?.deallocate()
        exited.signal()
    }

    // MARK: Loop-thread work

    /// Runs the jobs posted; false if there were none.
    @discardableResult func drainInbox() -> Bool {
        owner.preconditionCurrent()
        var ran = false
        defer {
            if let evLoop, !running.load(ordering: .relaxed) {
                inbox.withLock { $0.context = 0 }
                ev_break(evLoop, Int32(EVBREAK_ALL))
            }
        }
        while true {
            let jobs = inbox.withLock { box -> [@Sendable () -> Void] in
                let j = box.jobs
                box.jobs.removeAll(keepingCapacity: true)
                return j
            }
            if jobs.isEmpty { break }
            ran = true
            draining = true
            for j in jobs { j() }
            draining = false
        }
        let flush = flushAfterDrain
        flushAfterDrain.removeAll(keepingCapacity: true)
        for c in flush { c.flush() }
        return ran
    }

    /// The listener is readable: every waiting connection becomes an lws
    /// raw socket, read and written by Herald (HTTPConnection, then maybe
    /// WebSocketConnection), through TLS when it is on. Another loop may
    /// have taken them already.
    func readable(_ fd: Int32) {
        guard fd == listenFd, let context, let vh = lws_get_vhost_by_name(context, "default") else { return }
        while true {
            let c = herald_accept(listenFd)
            guard c >= 0 else {
                if errno == EMFILE || errno == ENFILE { refuseWithoutDescriptors() }
                return
            }
            // On failure lws closes the socket itself.
            _ = herald_adopt_raw_socket(vh, c, Protocols.httpName, tls == nil ? 0 : 1)
        }
    }

    /// Out of descriptors: frees the spare to accept one connection and
    /// close it unanswered, so the backlog drains instead of spinning. The
    /// loops share the process's descriptors, so another may take the one
    /// freed: then accepting pauses until the next tick (100 ms), which
    /// bounds the wake-ups a readable listener can cost.
    private func refuseWithoutDescriptors() {
        if spare < 0 { spare = open("/dev/null", O_RDONLY | O_CLOEXEC) }
        var closed = false
        if spare >= 0 {
            close(spare)
            let c = herald_accept(listenFd)
            if c >= 0 {
                close(c)
                closed = true
            }
            spare = open("/dev/null", O_RDONLY | O_CLOEXEC)
        }
        if closed {
            refused(.descriptors)
        } else if let listener, !acceptPaused {
            acceptPaused = true
            lws_rx_flow_control(listener, 0)
        }
    }

    /// Tick: accepting again after a pause for want of descriptors.
    private func resumeAccepting() {
        guard acceptPaused, let listener else { return }
        acceptPaused = false
        lws_rx_flow_control(listener, 1)
    }

    /// Counts a refusal; logs at most one line per 10 s per loop.
    func refused(_ reason: Metrics.RefusalReason) {
        gateway.metrics.refused(reason)
        let now = WallClock.now()
        guard now - lastRefusalLog >= 10_000 else { return }
        lastRefusalLog = now
        Log.warning(reason == .capacity
            ? "at the connection limit (\(admission.cap)): new connections are answered 503 (maxConnections)"
            : "out of file descriptors: new connections are closed unanswered (raise the descriptor limit or lower maxConnections)")
    }

    /// A new connection on `socket`: an HTTP connection, answering 503 past
    /// the process's connection cap.
    func adopt(_ socket: ConnectionSocket) -> HTTPConnection {
        owner.preconditionCurrent()
        let admitted = admission.admit()
        if !admitted { refused(.capacity) }
        let c = HTTPConnection(socket: socket, loop: self, overCapacity: !admitted)
        httpConnections[ObjectIdentifier(c)] = c
        return c
    }

    /// A connection's socket closed.
    func closed(_ c: RawConnection) {
        owner.preconditionCurrent()
        c.closed()
        forget(c)
        admission.release()
    }

    /// A connection closed, or an HTTP connection became a WebSocket.
    func forget(_ c: RawConnection) {
        httpConnections[ObjectIdentifier(c)] = nil
        webSockets[ObjectIdentifier(c)] = nil
    }

    /// `c` set a deadline.
    func deadlineChanged(_ c: HTTPConnection) {
        guard let d = c.deadline else { return }
        if !c.deadlineWatched {
            c.deadlineWatched = true
            deadlines[ObjectIdentifier(c)] = c
        }
        nextDeadlineCheck = min(nextDeadlineCheck, d)
    }

    /// `c` will have no deadline again (it closed, or became a WebSocket).
    func unwatchDeadlines(_ c: HTTPConnection) {
        guard c.deadlineWatched else { return }
        c.deadlineWatched = false
        deadlines[ObjectIdentifier(c)] = nil
    }

    /// Tells the HTTP connections whose deadline passed (`now`: `Clock.ticks`),
    /// and drops those that have none.
    func expireDeadlines(now: Millis) {
        guard now >= nextDeadlineCheck else { return }
        nextDeadlineCheck = .max
        var late: [HTTPConnection] = []
        var without: [HTTPConnection] = []
        for c in deadlines.values {
            guard let d = c.deadline else {
                without.append(c)
                continue
            }
            if d <= now { late.append(c) } else { nextDeadlineCheck = min(nextDeadlineCheck, d) }
        }
        for c in without { unwatchDeadlines(c) }
        for c in late { c.deadlinePassed(now: now) }
    }

    /// What the loop does every 100 ms.
    func runTick() {
        owner.preconditionCurrent()
        shard.runTimers()
        resumeAccepting()
        expireDeadlines(now: gateway.clock.ticks())
    }

    private func scheduleTick() {
        let t = UnsafeMutablePointer<herald_tick>.allocate(capacity: 1)
        t.initialize(to: herald_tick())
        t.pointee.owner = Unmanaged.passUnretained(self).toOpaque()
        tick = t
        armTick()
    }

    fileprivate func armTick() {
        guard let tick, let context else { return }
        tick.withMemoryRebound(to: lws_sorted_usec_list_t.self, capacity: 1) { sul in
            lws_sul_schedule(context, 0, sul, { sul in
                guard let sul else { return }
                let owner = sul.withMemoryRebound(to: herald_tick.self, capacity: 1) { $0.pointee.owner }
                let loop = Unmanaged<ServiceLoop>.fromOpaque(owner!).takeUnretainedValue()
                loop.runTick()
                loop.armTick()
            }, 100_000)
        }
    }

    // MARK: Shutdown

    /// Stops accepting and asks every connection to close (WebSockets 1001,
    /// held polls answered, event streams ended, HTTP connections once they
    /// owe no answer). Loop thread.
    func beginShutdown() {
        owner.preconditionCurrent()
        shuttingDown = true
        // lws closes the listening socket with its watcher (in every loop:
        // closing an fd twice is harmless only while no new one took it).
        if let listener { closeSoon(listener) }
        listener = nil
        listenFd = -1
        shard.shutdownSubscriptions()
        for ws in webSockets.values { ws.session.shutdown() }
        for c in httpConnections.values { c.shutDown() }
    }

    var openConnections: Int { webSockets.count + httpConnections.values.filter(\.isBusy).count }

    func stop(until deadline: DispatchTime) {
        running.store(false, ordering: .relaxed)
        inbox.withLock { box in if let ctx = OpaquePointer(bitPattern: box.context) { lws_cancel_service(ctx) } }
        if thread != nil { _ = exited.wait(timeout: deadline) }
    }
}

/// A connection with output waiting for the end of the inbox drain.
protocol Flushable: AnyObject {
    func flush()
}

public struct ServerError: Error, CustomStringConvertible {
    public let description: String
    /// Another process listens on the port: a usage error (exit status 2).
    public let addressInUse: Bool
    init(_ d: String, addressInUse: Bool = false) { description = d; self.addressInUse = addressInUse }
}
