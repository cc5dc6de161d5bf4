import CHiredis
import Foundation
import HeraldCore
import HeraldPorts
import Synchronization

/// The Redis pub/sub bus between gateway nodes (`--bus redis://...`).
///
/// Channels: 256, `herald:DB:N`, a user's records on the channel its key
/// hashes to; every node subscribes to all of them. The subscription is
/// fixed, so following a user costs nothing in Redis and a follow never
/// races a SUBSCRIBE; a resubscription is one command. The price is that
/// every node receives every change (its engine drops those of users it
/// has no followers for, one dictionary lookup). Redis preserves the order
/// of one connection's publishes, whatever the channel; the shards spread
/// over a Redis Cluster's nodes if one Redis is ever not enough.
///
/// Two threads, each with one blocking hiredis connection: the subscriber
/// blocks reading; the publisher connects, and reads the replies that
/// confirm each record. The engine writes each record to the publisher's
/// socket itself, without waiting (`enqueue`): one thread hop less between
/// a commit and the other nodes. Only what the socket does not take at
/// once, and what is held while Redis is away, the publisher writes.
/// Blocking calls on their own threads keep the bus out of the service
/// loops, never block the engine, and need no callbacks across the C
/// boundary (hiredis's libev adapter would). Either
/// connection, once lost, is made again with backoff (0.1 s doubling to
/// 2 s); the subscriber then resubscribes and reports it, and the engine
/// catches every follower up from the store.
typealias Context = UnsafeMutablePointer<redisContext>

public final class RedisBus: Bus, @unchecked Sendable {  // mutable state is under `cond`; each hiredis context is its thread's
    public static let channelCount = 256
    /// Records held while Redis is away; the oldest go first past it (other
    /// nodes see the gap at the user's next change, or resubscribe).
    static let queueLimit = 100_000
    /// How long a reply is awaited: every one the publisher waits for, and
    /// the subscriber's until it is subscribed.
    static let replySeconds = 2

    public let endpoint: RedisEndpoint
    /// Tells this node's records from others' when they come back.
    public let node = Random.hex(8)

    private let cond = MonotonicCondition()
    private var stopping = false
    private var receiver: BusReceiver?
    private var metrics = BusMetrics()
    private var subscriberFD: Int32 = -1
    private var currentState = "connecting"
    private let done = DispatchSemaphore(value: 0)
    private var threads = 0

    public init(_ endpoint: RedisEndpoint) { self.endpoint = endpoint }

    public func start(_ receiver: BusReceiver, metrics: BusMetrics) {
        cond.lock()
        self.receiver = receiver; self.metrics = metrics; threads = 2
        cond.unlock()
        let sub = Thread { [self] in Self.ownThread("herald-bus-sub"); subscribeLoop(); done.signal() }
        let pub = Thread { [self] in Self.ownThread("herald-bus-pub"); publishLoop(); done.signal() }
        sub.start()
        pub.start()
    }

    /// Names the bus's thread and blocks SIGPIPE on it: hiredis writes with
    /// plain `send`, and a write to a connection Redis closed must fail
    /// with EPIPE, not end the process (whatever the host does with the
    /// signal: `herald` ignores it, a test runner does not).
    private static func ownThread(_ name: String) {
        nameCurrentThread(name)
        var pipe = sigset_t()
        sigemptyset(&pipe)
        sigaddset(&pipe, SIGPIPE)
        pthread_sigmask(SIG_BLOCK, &pipe, nil)
    }

    public func stop() {
        cond.lock()
        stopping = true
        // Wakes the subscriber's blocking read; it clears the descriptor
        // under `cond` before closing it, so this never hits a reused one.
        if subscriberFD >= 0 { shutdown(subscriberFD, Int32(SHUT_RDWR)) }
        cond.broadcast()
        let n = threads
        cond.unlock()
        for _ in 0..<n { done.wait() }
    }

    public var state: String { cond.lock(); defer { cond.unlock() }; return currentState }

    public static func channel(of user: UserKey) -> Int {
        var h: UInt32 = 2_166_136_261  // FNV-1a
        for b in user.app.utf8 { h = (h ^ UInt32(b)) &* 16_777_619 }
        h = (h ^ 0) &* 16_777_619
        for b in user.user.utf8 { h = (h ^ UInt32(b)) &* 16_777_619 }
        return Int(h % UInt32(channelCount))
    }

    private func channelName(_ n: Int) -> [UInt8] { Array("herald:\(endpoint.db):\(n)".utf8) }

    // MARK: Publishing

    /// PUBLISH commands, in RESP, not yet written: held while Redis is away.
    private var queue = FIFO<[UInt8]>()
    /// Commands written (or being written) on the live connection, whose
    /// replies the publisher has not read yet, in order.
    private var unconfirmed = FIFO<[UInt8]>()
    /// The unwritten end of `unconfirmed`'s bytes (the socket took the rest).
    private var unwritten = FIFO<UInt8>()
    /// The publisher's descriptor while its connection is up and everything
    /// held has been handed to it; -1 otherwise.
    private var publisherFD: Int32 = -1
    /// The publisher is writing `unwritten` outside `cond`: nobody else may.
    private var flushing = false

    public func publish(_ records: [(UserKey, ChangeRecord)]) {
        enqueue(records.map { u, r in Self.command(channelName(Self.channel(of: u)), BusWire.encode(node: node, user: u, r)) })
    }

    public func publish(device deviceId: String, of user: UserKey) {
        enqueue([Self.command(channelName(Self.channel(of: user)), BusWire.encode(node: node, user: user, device: deviceId))])
    }

    /// `PUBLISH channel payload` in RESP.
    static func command(_ channel: [UInt8], _ payload: [UInt8]) -> [UInt8] {
        var out = Array("*3\r\n$7\r\nPUBLISH\r\n".utf8)
        for arg in [channel, payload] {
            out += Array("$\(arg.count)\r\n".utf8)
            out += arg
            out += [13, 10]
        }
        return out
    }

    /// Called on the engine's thread after a commit: on a live connection
    /// the commands go to the socket at once, in one write, without waiting
    /// (the publisher only reads the replies), so a record reaches Redis
    /// without a hop to another thread. Otherwise they are held in order.
    private func enqueue(_ commands: [[UInt8]]) {
        cond.lock()
        defer { cond.unlock() }
        guard publisherFD >= 0 else {
            let wasEmpty = queue.isEmpty
            queue.append(contentsOf: commands)
            trimQueue()
            // Not `signal`: the subscriber may be waiting on `cond` too (its
            // backoff), and the one woken might be it.
            if wasEmpty { cond.broadcast() }
            return
        }
        let wasIdle = unconfirmed.isEmpty
        unconfirmed.append(contentsOf: commands)
        for c in commands { unwritten.append(contentsOf: c) }
        if !flushing { writeAvailable() }
        metrics.queued.store(unconfirmed.count, ordering: .relaxed)
        // The publisher waits for work: a reply to read, or bytes to write.
        if wasIdle || !unwritten.isEmpty { cond.broadcast() }
    }

    /// Drops the oldest held commands past `queueLimit` (other nodes see the
    /// gap at the user's next change, or resubscribe); under `cond`.
    private func trimQueue() {
        let over = max(0, queue.count - Self.queueLimit)
        queue.removeFirst(over)
        metrics.dropped.add(over, ordering: .relaxed)
        metrics.queued.store(queue.count, ordering: .relaxed)
    }

    /// Writes what the socket takes of `unwritten` now; under `cond`. A
    /// failed write is left for the publisher, whose read then fails.
    private func writeAvailable() {
        let n = unwritten.elements.withUnsafeBytes { send(publisherFD, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
        if n > 0 { unwritten.removeFirst(n) }
    }

    /// The publisher's thread: connects, hands the connection to `enqueue`,
    /// writes what the socket would not take at once, and reads the replies.
    /// Each reply confirms its command reached Redis, unless it is an error
    /// (-NOPERM, -BUSY, ...): then that command and every later one go
    /// again, in order, on a new connection (a record that did reach Redis
    /// is dropped by the others as a duplicate, by its seq).
    private func publishLoop() {
        var backoff = Backoff()
        var failing = false
        while true {
            cond.lock()
            while queue.isEmpty && !stopping { cond.wait() }
            let idle = queue.isEmpty
            cond.unlock()
            if idle { break }  // stopping, nothing held
            let c: Context
            switch connect() {
            case .success(let connected): c = connected
            case .failure(let err):
                if !failing { Log.error("bus: cannot publish to Redis at \(endpoint): \(err); holding records and retrying") }
                failing = true
                if !pause(backoff.next()) { return }
                continue
            }
            cond.lock()
            unconfirmed = queue
            unwritten = FIFO(queue.elements.joined())
            queue.removeAll()
            publisherFD = c.pointee.fd
            cond.unlock()
            if failing { Log.info("bus: publishing to Redis at \(endpoint) again") }
            failing = false
            let why = confirmReplies(c) { backoff.reset() }
            cond.lock()
            publisherFD = -1
            flushing = false
            unconfirmed.append(contentsOf: queue.elements)
            queue = unconfirmed
            unconfirmed.removeAll()
            unwritten.removeAll()
            trimQueue()
            let leaving = stopping
            cond.unlock()
            redisFree(c)
            guard let why else { return }  // stopped with everything confirmed
            Log.error("bus: publishing to Redis at \(endpoint) failed: \(why); reconnecting")
            failing = true
            if leaving || !pause(backoff.next()) { return }
        }
    }

    /// On connection `c`, writes what `enqueue` could not and reads replies
    /// until the bus stops with nothing unconfirmed (nil) or the connection
    /// fails (why).
    private func confirmReplies(_ c: Context, confirmed: () -> Void) -> String? {
        while true {
            cond.lock()
            while unconfirmed.isEmpty && !stopping { cond.wait() }
            if unconfirmed.isEmpty {
                cond.unlock()
                return nil
            }
            let pending = unwritten.elements
            unwritten.removeAll()
            flushing = !pending.isEmpty
            cond.unlock()
            if !pending.isEmpty {
                // Blocking, up to the connection's timeout; `enqueue` adds
                // to `unwritten` meanwhile instead of writing.
                guard Self.writeAll(c.pointee.fd, pending) else { return "writing failed: \(String(cString: strerror(errno)))" }
                cond.lock()
                flushing = false
                let more = !unwritten.isEmpty
                cond.unlock()
                if more { continue }
            }
            guard let r = reply(c) else { return errorText(c) }
            if let refusal = Self.refusal(r) { return "Redis answered \(refusal)" }
            cond.lock()
            unconfirmed.removeFirst()
            metrics.queued.store(unconfirmed.count, ordering: .relaxed)
            cond.unlock()
            metrics.published.add(1, ordering: .relaxed)
            confirmed()
        }
    }

    private static func writeAll(_ fd: Int32, _ bytes: ArraySlice<UInt8>) -> Bool {
        var at = 0
        while at < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + at, $0.count - at, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return false }
            at += n
        }
        return true
    }

    // MARK: Subscribing

    private func subscribeLoop() {
        var backoff = Backoff()
        var subscribedOnce = false
        var lostAt: Date? = nil
        var reported = false
        while !isStopping {
            let c: Context
            switch subscribe() {
            case .success(let subscribed):
                c = subscribed
            case .failure(let why):
                if !reported { Log.error("bus: cannot subscribe to Redis at \(endpoint): \(why); retrying") }
                reported = true
                setState(subscribedOnce ? "disconnected" : "connecting")
                if !pause(backoff.next()) { return }
                continue
            }
            cond.lock()
            let leaving = stopping
            if !leaving { currentState = "connected" }
            cond.unlock()
            if leaving { return unsubscribed(c) }
            metrics.connected.store(1, ordering: .relaxed)
            if subscribedOnce {
                metrics.resubscriptions.add(1, ordering: .relaxed)
                let away = lostAt.map { String(format: " after %.1f s", Date().timeIntervalSince($0)) } ?? ""
                Log.info("bus: subscribed to Redis at \(endpoint) again\(away); catching every follower up from the store")
            } else {
                Log.info("bus: subscribed to Redis at \(endpoint) (node \(node))")
            }
            subscribedOnce = true
            reported = false
            backoff.reset()
            receiver?.subscribed()
            let err = readMessages(c)
            unsubscribed(c)
            let quitting = isStopping
            metrics.connected.store(0, ordering: .relaxed)
            setState("disconnected")
            if quitting { break }
            lostAt = Date()
            if !reported { Log.error("bus: lost Redis at \(endpoint): \(err); reconnecting (devices stay connected)") }
            reported = true
        }
    }

    private var isStopping: Bool { cond.lock(); defer { cond.unlock() }; return stopping }

    private func setState(_ s: String) {
        cond.lock()
        currentState = s
        cond.unlock()
    }

    /// Connects and subscribes to every channel, or answers why not. The
    /// descriptor is known to `stop` from the start, and each reply is
    /// awaited 2 s at most, so a Redis that never answers holds nothing; an
    /// error reply (-NOPERM: an ACL denies the channels) is a refusal.
    private func subscribe() -> Result<Context, Failure> {
        let c: Context
        switch connect() {
        case .success(let connected): c = connected
        case .failure(let why): return .failure(why)
        }
        cond.lock()
        subscriberFD = c.pointee.fd
        cond.unlock()
        _ = command(c, [Array("SUBSCRIBE".utf8)] + (0..<Self.channelCount).map(channelName), append: true)
        for _ in 0..<Self.channelCount {
            let why: String?
            if let r = reply(c) { why = Self.refusal(r).map { "Redis answered \($0)" } } else { why = errorText(c) }
            if let why {
                unsubscribed(c)
                return .failure(.failed(why))
            }
        }
        // Messages may come minutes apart: from here reads wait without a
        // limit, and TCP keepalive notices a vanished server.
        _ = redisSetTimeout(c, timeval(tv_sec: 0, tv_usec: 0))
        return .success(c)
    }

    /// Forgets the subscriber's descriptor (under `cond`, so `stop` never
    /// shuts a reused one), then closes it.
    private func unsubscribed(_ c: Context) {
        cond.lock()
        subscriberFD = -1
        cond.unlock()
        redisFree(c)
    }

    /// Hands other nodes' records to the receiver until the connection
    /// fails; answers why.
    private func readMessages(_ c: Context) -> String {
        while true {
            guard var r = reply(c) else { return errorText(c) }
            var batch: [(UserKey, ChangeRecord)] = []
            // Whatever else the last read brought, without blocking: one hop
            // to the engine for all of it.
            while true {
                take(r.assumingMemoryBound(to: redisReply.self).pointee, into: &batch)
                freeReplyObject(r)
                var next: UnsafeMutableRawPointer? = nil
                guard redisReaderGetReply(c.pointee.reader, &next) == REDIS_OK, let n = next else { break }
                r = n
            }
            if !batch.isEmpty {
                metrics.received.add(batch.count, ordering: .relaxed)
                receiver?.received(batch)
            }
        }
    }

    private func take(_ r: redisReply, into batch: inout [(UserKey, ChangeRecord)]) {
        guard r.type == REDIS_REPLY_ARRAY, r.elements == 3, let e = r.element, let kind = e[0], let payload = e[2],
              kind.pointee.len == 7, memcmp(kind.pointee.str, "message", 7) == 0 else { return }
        let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(payload.pointee.str)?.assumingMemoryBound(to: UInt8.self),
                                        count: payload.pointee.len)
        // Every node hears every channel: only records of users followed
        // here are worth decoding, and never this node's own.
        let own = node, receiver = receiver
        guard let m = BusWire.decode(bytes, wanted: { n, u in n != own && receiver?.follows(u) == true })
        else { return Log.warning("bus: dropped a message that is not a change record") }
        guard m.node != node else { return }
        switch m.message {
        case .record(let r): batch.append((m.user, r))
        case .device(let id): receiver?.deviceChanged(m.user, deviceId: id)
        case .unwanted: break
        }
    }

    // MARK: hiredis

    enum Failure: Error, CustomStringConvertible {
        case failed(String)
        var description: String { switch self { case .failed(let m): m } }
    }

    /// A connection, authenticated when the URL has a password, whose
    /// replies are awaited `replySeconds` at most.
    private func connect() -> Result<Context, Failure> {
        guard let p = redisConnectWithTimeout(endpoint.host, endpoint.port, timeval(tv_sec: 2, tv_usec: 0)) else {
            return .failure(.failed("out of memory"))
        }
        let c = p
        guard p.pointee.err == 0 else {
            let e = errorText(c)
            redisFree(p)
            return .failure(.failed(e))
        }
        _ = redisEnableKeepAlive(p)
        _ = redisSetTimeout(p, timeval(tv_sec: Self.replySeconds, tv_usec: 0))
        if let password = endpoint.password {
            let args = [Array("AUTH".utf8)] + (endpoint.user.map { [Array($0.utf8)] } ?? []) + [Array(password.utf8)]
            guard let r = command(c, args, append: false) else {
                let e = errorText(c)
                redisFree(p)
                return .failure(.failed(e))
            }
            if let refused = Self.refusal(r) {
                redisFree(p)
                return .failure(.failed(refused))
            }
        }
        return .success(c)
    }

    /// Sends one command: queued for a pipeline (`append`, answers nil), or
    /// sent and answered (nil when the connection failed).
    @discardableResult
    private func command(_ c: Context, _ args: [[UInt8]], append: Bool) -> UnsafeMutableRawPointer? {
        let lengths = args.map(\.count)
        let joined: [UInt8] = args.joined() + [0]  // never empty, so it has an address
        return joined.withUnsafeBufferPointer { buf in
            var offset = 0
            var argv: [UnsafePointer<CChar>?] = lengths.map { n in
                defer { offset += n }
                return UnsafeRawPointer(buf.baseAddress! + offset).assumingMemoryBound(to: CChar.self)
            }
            if append {
                _ = redisAppendCommandArgv(c, Int32(args.count), &argv, lengths)
                return nil
            }
            return redisCommandArgv(c, Int32(args.count), &argv, lengths)
        }
    }

    /// The next reply (blocking), or nil when the connection failed.
    private func reply(_ c: Context) -> UnsafeMutableRawPointer? {
        var r: UnsafeMutableRawPointer? = nil
        guard redisGetReply(c, &r) == REDIS_OK else { return nil }
        return r
    }

    /// Frees reply `r`; answers its text if it is an error (-NOPERM, -BUSY,
    /// -WRONGPASS, ...), else nil.
    private static func refusal(_ r: UnsafeMutableRawPointer) -> String? {
        defer { freeReplyObject(r) }
        let answer = r.assumingMemoryBound(to: redisReply.self).pointee
        guard answer.type == REDIS_REPLY_ERROR else { return nil }
        return answer.str.map { String(cString: $0) } ?? "an error"
    }

    private func errorText(_ c: Context) -> String {
        var p = c.pointee
        let s = withUnsafePointer(to: &p.errstr) { $0.withMemoryRebound(to: CChar.self, capacity: 128) { String(cString: $0) } }
        return s.isEmpty ? "connection closed" : s
    }

    /// Waits `seconds` unless the bus stops first (then answers false).
    private func pause(_ seconds: Double) -> Bool {
        let until = MonotonicCondition.Deadline.seconds(fromNow: seconds)
        cond.lock()
        defer { cond.unlock() }
        while !stopping, cond.wait(until: until) {}
        return !stopping
    }
}

/// Reconnection delays: 0.1 s doubling to 2 s, with jitter so nodes that
/// lost Redis together do not all come back in the same millisecond.
struct Backoff {
    private var delay = 0.1
    mutating func next() -> Double {
        defer { delay = min(delay * 2, 2) }
        return delay * Double.random(in: 0.8...1.2)
    }
    mutating func reset() { delay = 0.1 }
}
