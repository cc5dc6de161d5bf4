import HeraldCore
import HeraldGateway

/// One HTTP/1.1 connection on a raw socket (`ConnectionSocket`: lws's, or a
/// test's in memory). Herald frames requests itself (`HTTPWire`): lws
/// 4.1.6's HTTP server rewrites paths (`;` and `&` end a segment, `%2F`
/// becomes a separator, dot segments collapse), loops
/// forever on a pipelined request with a body (it feeds the buffered bytes
/// to the body twice), and reads nothing from a connection while its answer
/// is pending, so a client leaving a held poll or an event stream went
/// unnoticed while its readable socket spun the loop.
///
/// Requests are answered one at a time, in order: the bytes of pipelined
/// requests wait in `input` until the answers before them are out.
final class HTTPConnection: Flushable, RawConnection {
    enum State {
        /// Reading a request head.
        case idle
        /// Reading the body of a request whose head is parsed.
        case receivingBody(HTTPWire.Head)
        /// The gateway has the request; its answer comes through `Exchange`.
        case awaitingAnswer(keepAlive: Bool)
        /// `output` holds the answer; then the next request, or closing.
        case writingAnswer(keepAlive: Bool)
        /// An answer of unknown length (Server-Sent Events) taking chunks
        /// into `output` until it is `finishing`; the connection then closes.
        case streaming(finishing: Bool)
        /// The last answer is out and our side shut: input is read and
        /// dropped until the client closes, so it reads the answer instead
        /// of a reset for the unread request bytes.
        case lingering
        case closed
    }

    private let socket: ConnectionSocket
    unowned let loop: ServiceLoop
    /// The loop's thread, which every entry point checks: held here, as a
    /// check through `loop` would cost an unowned reference's retain.
    private let owner: ThreadOwner
    private var state = State.idle
    /// Numbers requests on this connection, so a late answer to an earlier
    /// one is never written into a later exchange.
    private var serial = 0
    /// Bytes read and not yet taken, from `inputStart` on: the request
    /// being read and any pipelined after it.
    private var input: [UInt8] = []
    private var inputStart = 0
    /// How far past `inputStart` the search for the end of the request head
    /// got (`HTTPWire.parseHead`): a head arriving in many pieces is not
    /// searched again from its start on every read.
    private var headScanned = 0
    /// The request being answered is a HEAD: its answer is the head alone.
    private var answeringHead = false
    /// Whether the loop's table of deadlines holds this connection (the loop sets it).
    var deadlineWatched = false
    /// Bytes to write, from `written` on.
    private var output: [UInt8] = []
    private var written = 0
    /// Reading stopped: a request's worth of input waits already.
    private var readingPaused = false
    private var closeHook: (() -> Void)?
    private var drainWaiters: [(below: Int, run: () -> Void)] = []
    private var flushQueued = false
    /// Inside `pump`, which writes what an answer given meanwhile queues.
    private var pumping = false
    /// The request being read has its deadline: `requestTimeoutSeconds`
    /// from its first byte to its last, however slowly they come.
    private var requestTimed = false
    /// When the request being read, the keep-alive wait for the next one,
    /// or the linger after the last answer ends (`Clock.ticks`).
    private var readDeadline: Millis?
    /// While output waits for the socket: when the socket must have taken
    /// some of it (`writeTimeoutSeconds` after it last did, or after the
    /// output was queued).
    private var writeDeadline: Millis?
    /// Whether the answer being given may be chunked (not to HTTP/1.0).
    private var streamsChunked = true

    static let keepAliveSeconds = 5
    static let lingerSeconds = 2

    /// Accepted past the process's connection cap: every request is
    /// answered 503 and the connection closed.
    private let overCapacity: Bool

    init(socket: ConnectionSocket, loop: ServiceLoop, overCapacity: Bool) {
        self.socket = socket
        self.loop = loop
        owner = loop.owner
        self.overCapacity = overCapacity
        // The first request is due within the request timeout of the accept.
        timeRequest()
    }

    var isBusy: Bool {
        switch state {
        case .awaitingAnswer, .writingAnswer, .streaming: true
        case .idle, .receivingBody, .lingering, .closed: false
        }
    }

    // MARK: Input

    func receive(_ data: UnsafeRawBufferPointer) {
        owner.preconditionCurrent()
        switch state {
        case .streaming, .lingering, .closed:
            return // nothing after a stream or a last answer is answered
        case .idle, .receivingBody:
            // The first byte of a request starts its deadline; later bytes
            // do not move it (a byte every few seconds would hold the
            // connection for ever).
            if !requestTimed { timeRequest() }
        case .awaitingAnswer, .writingAnswer:
            break
        }
        input.append(contentsOf: data)
        if !readingPaused, input.count - inputStart > HTTPWire.maxHead + loop.gateway.config.limits.maxBodyBytes {
            readingPaused = true
            socket.setReading(false)
        }
        pump()
    }

    /// Takes the next request from `input` and dispatches it (or answers it
    /// if it is refused); false while it is incomplete.
    private func takeRequest() -> Bool {
        if case .idle = state {
            switch HTTPWire.parseHead(input[inputStart...], scanned: &headScanned) {
            case .incomplete:
                return false
            case .malformed(let e):
                answeringHead = false
                answer(.error(e), keepAlive: false)
                return true
            case .head(let h, let size):
                inputStart += size
                headScanned = 0
                answeringHead = h.request.method == "HEAD"
                let max = loop.gateway.config.limits.maxBodyBytes
                guard h.bodyLength <= max else {
                    answer(.error(HeraldError(.tooLarge, "request body larger than \(max) bytes")), keepAlive: false)
                    return true
                }
                state = .receivingBody(h)
                if h.expectsContinue, input.count - inputStart < h.bodyLength {
                    // A refused request's body is not wanted: the answer goes
                    // now, and the connection closes (the client sends the
                    // body after a 100 only, or after a wait of its own).
                    if let (r, _) = refusal(h) {
                        answer(r, keepAlive: false)
                        return true
                    }
                    output = HTTPWire.continueHead
                    written = 0
                    return true  // `pump` sends it, then waits for the body
                }
            }
        }
        guard case .receivingBody(var h) = state, input.count - inputStart >= h.bodyLength else { return false }
        h.request.body = Array(input[inputStart..<inputStart + h.bodyLength])
        inputStart += h.bodyLength
        if let (r, keepAlive) = refusal(h) {
            answer(r, keepAlive: keepAlive)
            return true
        }
        switch WebSocketHandshake.answer(h) {
        case .refuse(let r)?:
            answer(r, keepAlive: false)
            return true
        case .upgrade(let head)? where !loop.shuttingDown:
            upgrade(head, origin: h.request.headers["origin"])
            return false
        case .upgrade?:
            answer(.error(HeraldError(.unavailable, "the gateway is shutting down")), keepAlive: false)
            return true
        case nil:
            break
        }
        serial += 1
        streamsChunked = !h.http10
        state = .awaitingAnswer(keepAlive: h.keepAlive)
        // Answers come back asynchronously (held polls after up to 60 s).
        stopRequestTimer()
        loop.gateway.handle(h.request, shard: loop.shard, responder: Exchange(conn: self, serial: serial))
        return true
    }

    /// The answer to a request the gateway is not to see, and whether the
    /// connection may go on after it.
    private func refusal(_ h: HTTPWire.Head) -> (HTTPResponse, keepAlive: Bool)? {
        if let e = h.refusal { return (.error(e), h.keepAlive) }
        // A load balancer or client moves on to another process or node.
        if overCapacity {
            return (.error(HeraldError(.unavailable, "this gateway process is at its connection limit", retryAfterSeconds: 5)), false)
        }
        return nil
    }

    /// Hands the socket to a WebSocket, with the frames that came behind the
    /// handshake. This connection is done.
    private func upgrade(_ head: [UInt8], origin: String?) {
        clearDeadlines()
        if readingPaused { socket.setReading(true) }
        let early = Array(input[inputStart...])
        state = .closed
        input = []
        loop.forget(self)
        socket.upgrade(handshake: head, origin: origin, early: early)
    }

    /// Back to reading requests after a kept-alive answer.
    private func resumeReading() {
        // Taken input is dropped in bulk: one shift per request would make a
        // long pipeline quadratic.
        if inputStart == input.count {
            input = []
            inputStart = 0
        } else if inputStart >= 65536 {
            input.removeFirst(inputStart)
            inputStart = 0
        }
        if input.count > inputStart {
            timeRequest() // a pipelined request: its deadline starts now
        } else {
            requestTimed = false
            setReadDeadline(seconds: Self.keepAliveSeconds)
        }
        if readingPaused {
            readingPaused = false
            socket.setReading(true)
        }
    }

    private func timeRequest() {
        requestTimed = true
        setReadDeadline(seconds: loop.gateway.config.limits.requestTimeoutSeconds)
    }

    private func stopRequestTimer() {
        requestTimed = false
        setReadDeadline(seconds: nil)
    }

    // MARK: Answers (from `Exchange`, on the loop thread: checked, as the
    // answer may come from a reply that crossed to an engine and back)

    func respond(_ r: HTTPResponse, serial: Int) {
        owner.preconditionCurrent()
        guard serial == self.serial, case .awaitingAnswer(let keepAlive) = state else { return }
        answer(r, keepAlive: keepAlive)
    }

    /// Queues a whole answer: head and body go out in one write when the
    /// socket takes them. An answer to HEAD is its head alone (RFC 9110
    /// 9.3.2), with the body's Content-Length.
    private func answer(_ r: HTTPResponse, keepAlive: Bool) {
        let keepAlive = keepAlive && !loop.shuttingDown
        // A refusal while reading: from here on the write timeout rules.
        if requestTimed { stopRequestTimer() }
        // HTTP/1.0 closes unless told otherwise (RFC 9112 9.3): a kept connection says so.
        output = HTTPWire.responseHead(r, length: r.body.count, close: !keepAlive, keepAlive: keepAlive && !streamsChunked)
            + (answeringHead ? [] : r.body)
        written = 0
        closeHook = nil
        state = .writingAnswer(keepAlive: keepAlive)
        requestWrite()
    }

    /// Streams go out chunked (raw to an HTTP/1.0 client) and end by
    /// closing the connection.
    func startStream(contentType: String, headers: [(String, String)], serial: Int) {
        owner.preconditionCurrent()
        guard serial == self.serial, case .awaitingAnswer = state else { return }
        output = HTTPWire.responseHead(HTTPResponse(status: 200, contentType: contentType, headers: headers, body: []),
                                       length: nil, chunked: streamsChunked, close: true)
        written = 0
        // (No route streams to HEAD; if one did, the head alone goes out.)
        state = .streaming(finishing: answeringHead)
        requestWrite()
    }

    func send(_ bytes: [UInt8], serial: Int) {
        owner.preconditionCurrent()
        guard serial == self.serial, case .streaming(finishing: false) = state, !bytes.isEmpty else { return }
        if written >= 65536 {
            output.removeFirst(written)
            written = 0
        }
        output += streamsChunked ? HTTPWire.chunk(bytes) : bytes
        requestWrite()
    }

    func finish(serial: Int) {
        owner.preconditionCurrent()
        guard serial == self.serial, case .streaming(finishing: false) = state else { return }
        if streamsChunked { output += HTTPWire.lastChunk }
        state = .streaming(finishing: true)
        drainWaiters = []
        requestWrite()
    }

    func queuedBytes(serial: Int) -> Int {
        owner.preconditionCurrent()
        guard serial == self.serial, case .streaming = state else { return 0 }
        return output.count - written
    }

    func onClose(_ f: @escaping () -> Void, serial: Int) {
        owner.preconditionCurrent()
        guard serial == self.serial else { return }
        switch state {
        case .awaitingAnswer, .streaming: closeHook = f
        default: break
        }
    }

    func whenDrained(below bytes: Int, _ f: @escaping () -> Void, serial: Int) {
        owner.preconditionCurrent()
        guard serial == self.serial, case .streaming(finishing: false) = state else { return }
        if output.count - written < bytes { f() } else { drainWaiters.append((bytes, f)) }
    }

    /// Runs the drain waiters whose level is reached; true if any ran.
    private func runDrainWaiters() -> Bool {
        let queued = output.count - written
        let ready = drainWaiters.filter { queued < $0.below }
        guard !ready.isEmpty else { return false }
        drainWaiters.removeAll { queued < $0.below }
        for w in ready { w.run() }
        return true
    }

    // MARK: Output

    private func requestWrite() {
        guard !pumping else { return } // `pump` writes it, or watches it
        // Output is queued now: the socket must take some of it in time,
        // even if it never says it has room.
        if writeDeadline == nil { watchWrite() }
        loop.requestWrite(self, socket: socket, queued: &flushQueued)
    }

    // MARK: Deadlines (watched by the loop's tick)

    /// The earlier deadline, past which the loop calls `deadlinePassed`.
    var deadline: Millis? {
        guard let w = writeDeadline else { return readDeadline }
        return min(w, readDeadline ?? w)
    }

    /// Clearing a deadline costs no call to the loop: the next check
    /// drops a connection that has none left.
    private func setReadDeadline(seconds: Int?) {
        readDeadline = seconds.map { loop.gateway.clock.ticks() + Millis($0) * 1000 }
        if readDeadline != nil { loop.deadlineChanged(self) }
    }

    private func watchWrite() {
        writeDeadline = loop.gateway.clock.ticks() + Millis(loop.gateway.config.limits.writeTimeoutSeconds) * 1000
        loop.deadlineChanged(self)
    }

    private func unwatchWrite() { writeDeadline = nil }

    /// No deadline from here on: the connection is closing, or a WebSocket.
    private func clearDeadlines() {
        readDeadline = nil
        writeDeadline = nil
        loop.unwatchDeadlines(self)
    }

    func deadlinePassed(now: Millis) {
        owner.preconditionCurrent()
        guard let w = writeDeadline, w <= now else {
            // The request took too long to come, or the client kept an
            // idle connection or a linger past its time.
            return kill()
        }
        // The socket took none of the output for `writeTimeoutSeconds`: the
        // client is not reading (its answer, or its event stream). A stream
        // the gateway ended (an expired token, a deleted device) was counted
        // when it was ended.
        if case .streaming(finishing: true) = state {} else { loop.gateway.metrics.dropped(.slowConsumer) }
        kill()
    }

    /// End of a drain: write now what the socket takes.
    func flush() {
        owner.preconditionCurrent()
        flushQueued = false
        pump()
    }

    /// lws sent what it held for us, or the socket has room.
    func writable() -> Int32 {
        owner.preconditionCurrent()
        pump()
        return 0
    }

    /// Moves the connection on as far as it can go now: writes what is
    /// queued, then takes the next request waiting in `input`.
    private func pump() {
        guard !pumping else { return }
        pumping = true
        defer { pumping = false }
        while true {
            switch state {
            case .idle, .receivingBody:
                // A `100 Continue` still going out goes first.
                if !output.isEmpty { guard drain() else { return } }
                guard takeRequest() else { return }
            case .writingAnswer(let keepAlive):
                guard drain() else { return }
                guard keepAlive else { return linger() }
                state = .idle
                resumeReading()
            case .streaming(let finishing):
                let done = drain()
                if done, finishing { return linger() }
                // Waiters may queue more: write that too, if the socket took all.
                guard runDrainWaiters(), done else { return }
            case .awaitingAnswer, .lingering, .closed:
                return
            }
        }
    }

    /// Writes `output` until all of it is sent (true) or the socket takes no
    /// more; `writable` comes when it has room again. Every byte the socket
    /// takes is progress that moves `writeDeadline` on.
    private func drain() -> Bool {
        var moved = false
        while written < output.count {
            let n = min(output.count - written, ServiceLoop.outputLimit)
            let from = written
            let r = output.withUnsafeBytes { socket.write(UnsafeRawBufferPointer(rebasing: $0[from..<from + n])) }
            if case .wrote(let sent) = r {
                written += sent
                moved = true
                if sent < n { break } // the socket is full
            } else if case .full = r {
                break
            } else {
                kill()
                return false
            }
        }
        guard written == output.count else {
            socket.wantWritable()
            if moved || writeDeadline == nil { watchWrite() }
            return false
        }
        output.removeAll()
        written = 0
        unwatchWrite()
        return true
    }

    /// After the last answer: shut our side, read until the client closes.
    private func linger() {
        state = .lingering
        input = []
        inputStart = 0
        socket.shutdownWrite()
        setReadDeadline(seconds: Self.lingerSeconds)
        if readingPaused {
            readingPaused = false
            socket.setReading(true)
        }
    }

    // MARK: Closing

    /// Gateway shutdown: a connection that owes no answer closes now; the
    /// others close after theirs (`Connection: close`).
    func shutDown() {
        owner.preconditionCurrent()
        if !isBusy { kill() }
    }

    private func kill() {
        if case .closed = state { return }
        clearDeadlines()
        socket.close()
    }

    func closed() {
        owner.preconditionCurrent()
        state = .closed
        clearDeadlines()
        drainWaiters = []
        let hook = closeHook
        closeHook = nil
        hook?()
    }
}

/// One request's way back to its connection.
final class Exchange: HTTPResponder, @unchecked Sendable {  // crosses threads inside LoopBound replies; each call checks the loop thread
    private weak var conn: HTTPConnection?
    private let serial: Int

    init(conn: HTTPConnection, serial: Int) {
        self.conn = conn
        self.serial = serial
    }

    func respond(_ r: HTTPResponse) { conn?.respond(r, serial: serial) }
    func startStream(contentType: String, headers: [(String, String)]) {
        conn?.startStream(contentType: contentType, headers: headers, serial: serial)
    }
    func send(_ bytes: [UInt8]) { conn?.send(bytes, serial: serial) }
    func finish() { conn?.finish(serial: serial) }
    var queuedBytes: Int { conn?.queuedBytes(serial: serial) ?? 0 }
    func onClose(_ f: @escaping () -> Void) { conn?.onClose(f, serial: serial) }
    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) { conn?.whenDrained(below: bytes, f, serial: serial) }
}
