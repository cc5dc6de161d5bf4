import CNGHTTP2
import Glibc
import HeraldCurl

/// One connection to an origin: a non-blocking socket, TLS (`TLSSession`),
/// an nghttp2 client session, the streams on it and the requests waiting
/// for one. Kept open while idle, with a PING every `pingInterval`; a PING
/// unanswered within `pingTimeout`, a socket error or EOF closes it. A
/// GOAWAY (or stream ids used up) retires it: no new stream, closed once
/// its last one is answered. What ends is put in `finished` and `unsent`
/// for the loop, which completes the one and sends the other again. On the
/// loop thread only.
final class HTTP2Connection {
    enum State { case connecting, handshaking, ready, closed }

    struct Limits {
        let maxResponseBytes: Int
        let pingInterval: Duration
        let pingTimeout: Duration
        let firstStreamID: Int32
    }

    let origin: Origin
    private(set) var state = State.connecting
    private let limits: Limits
    private var fd: Int32 = -1
    /// Addresses not tried yet, in getaddrinfo's order.
    private var addresses: [[UInt8]]
    /// When the connect to the current address began: past `connectTimeout`, the next is tried.
    private var connectingSince: ContinuousClock.Instant
    /// An address that takes longer (a route blackholed, say) is given up for the next one.
    static let connectTimeout = Duration.seconds(5)
    private let tls: TLSSession
    private var session: OpaquePointer?
    /// Ciphertext for the socket: `output[outputSent...]` is still to go.
    private var output: [UInt8] = []
    private var outputSent = 0
    private var streams: [Int32: HTTP2Exchange] = [:]
    /// Waiting for the connection, or for a stream within the server's limit.
    private var pending: [HTTP2Exchange] = []
    /// Streams the server refused (RST_STREAM or GOAWAY), sorted out once the frame is read.
    private var refused: [(Int32, HTTP2Exchange)] = []
    private var goAwayLastStream: Int32?
    /// After a GOAWAY, or once stream ids are used up (after 2^30 requests):
    /// no new stream; closed once the last one ends.
    private var retired = false
    /// Since when no request has been on the connection: the next PING is due an interval after.
    private var quietSince: ContinuousClock.Instant
    private var pingSentAt: ContinuousClock.Instant?

    /// For the loop: requests that ended, and requests to send again on another connection.
    var finished: [(HTTP2Exchange, Result<CurlResponse, CurlFailure>)] = []
    var unsent: [HTTP2Exchange] = []

    /// Resolves and starts connecting. getaddrinfo blocks the loop thread for
    /// the lookup: the push services' few names, cached by the system's resolver.
    init(_ origin: Origin, tls context: TLSContext, limits: Limits) throws(CurlFailure) {
        self.origin = origin; self.limits = limits
        quietSince = .now
        connectingSince = .now
        tls = try TLSSession(context, host: origin.host)
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG
        var found: UnsafeMutablePointer<addrinfo>?
        let code = getaddrinfo(origin.host, String(origin.port), &hints, &found)
        guard code == 0 else { throw .connect("cannot resolve \(origin.host): " + String(cString: gai_strerror(code))) }
        defer { freeaddrinfo(found) }
        addresses = []
        var next = found
        while let a = next {
            addresses.append(Array(UnsafeRawBufferPointer(start: a.pointee.ai_addr, count: Int(a.pointee.ai_addrlen))))
            next = a.pointee.ai_next
        }
        if let failure = connectNext(after: "no address") { throw failure }
    }

    deinit {
        if let session { nghttp2_session_del(session) }
        if fd >= 0 { Glibc.close(fd) }
    }

    var isOpen: Bool { state != .closed && !retired }

    /// poll()'s events for the socket.
    var events: Int16 {
        switch state {
        case .connecting: Int16(POLLOUT)
        case .handshaking, .ready: Int16(POLLIN) | (outputSent < output.count ? Int16(POLLOUT) : 0)
        case .closed: 0
        }
    }

    var socket: Int32 { fd }

    func add(_ exchange: HTTP2Exchange) {
        pending.append(exchange)
        startStreams()
    }

    // MARK: Connecting

    /// Connects to the next address; the failure when none is left.
    private func connectNext(after lastError: String) -> CurlFailure? {
        var why = lastError
        while !addresses.isEmpty {
            let address = addresses.removeFirst()
            connectingSince = .now
            let family = address.withUnsafeBytes { Int32($0.load(as: sockaddr.self).sa_family) }
            fd = Glibc.socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            guard fd >= 0 else { why = String(cString: strerror(errno)); continue }
            var on: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
            let r = address.withUnsafeBytes { connect(fd, $0.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t($0.count)) }
            if r == 0 || errno == EINPROGRESS { return nil }
            why = String(cString: strerror(errno))
            Glibc.close(fd)
            fd = -1
        }
        return .connect("\(origin.authority): \(why)")
    }

    private func connected() {
        var error: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
        guard error == 0 else {
            Glibc.close(fd)
            fd = -1
            if let failure = connectNext(after: String(cString: strerror(error))) { close(failure) }
            return
        }
        state = .handshaking
        handshake()
    }

    private func handshake() {
        switch tls.handshake() {
        case .wantRead: break
        case .failed(let f): close(f)
        case .done:
            guard let s = Self.newSession(self) else { return close(.other("nghttp2_session_client_new failed")) }
            session = s
            state = .ready
            quietSince = .now
            startStreams()
        }
        tls.take(into: &output)
    }

    private static func newSession(_ c: HTTP2Connection) -> OpaquePointer? {
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0 else { return nil }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks, onHeader)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, onData)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, onFrame)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, onStreamClose)
        var session: OpaquePointer?
        // Unretained: the connection deletes the session before it goes.
        guard nghttp2_session_client_new(&session, callbacks, Unmanaged.passUnretained(c).toOpaque()) == 0 else { return nil }
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0)]
        nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        if c.limits.firstStreamID > 1 { nghttp2_session_set_next_stream_id(session, c.limits.firstStreamID) }
        return session
    }

    // MARK: Streams

    /// Starts waiting requests while the server's SETTINGS_MAX_CONCURRENT_STREAMS leaves room.
    private func startStreams() {
        guard state == .ready, isOpen, let session else { return }
        let room = Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)) - streams.count
        let starting = pending.prefix(max(0, room))
        pending.removeFirst(starting.count)
        for ex in starting { submit(ex, session) }
    }

    private func submit(_ ex: HTTP2Exchange, _ session: OpaquePointer) {
        let r = ex.request
        let fields = [(":method", r.method), (":scheme", "https"), (":authority", origin.authority), (":path", ex.path)]
            + r.headers.map { ($0.0.lowercased(), $0.1) }
        // Every name and value in one buffer, alive for the call: nghttp2_submit_request copies them.
        var bytes: [UInt8] = []
        var spans: [(name: Int, nameLength: Int, value: Int, valueLength: Int)] = []
        for (name, value) in fields {
            let n = bytes.count
            bytes += name.utf8
            let v = bytes.count
            bytes += value.utf8
            spans.append((n, name.utf8.count, v, value.utf8.count))
        }
        let id = bytes.withUnsafeMutableBufferPointer { b in
            var nva = spans.map {
                nghttp2_nv(name: b.baseAddress! + $0.name, value: b.baseAddress! + $0.value, namelen: $0.nameLength,
                           valuelen: $0.valueLength, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            }
            // The body is read from the exchange by stream id (`readBody`); nghttp2 copies the provider.
            var body = nghttp2_data_provider(source: nghttp2_data_source(ptr: nil), read_callback: Self.readBody)
            return r.body.isEmpty ? nghttp2_submit_request(session, nil, &nva, nva.count, nil, nil)
                : nghttp2_submit_request(session, nil, &nva, nva.count, &body, nil)
        }
        if id == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE.rawValue {
            // Every id of this connection was used: the request goes on a new one.
            unsent.append(ex)
            return retire()
        }
        guard id > 0 else { return finished.append((ex, .failure(.other("nghttp2_submit_request: " + String(cString: nghttp2_strerror(id)))))) }
        streams[id] = ex
    }

    /// A stream ended: its exchange's result, or it goes again.
    private func streamClosed(_ id: Int32, code: UInt32) {
        guard let ex = streams.removeValue(forKey: id) else { return }
        if let f = ex.failure {
            finished.append((ex, .failure(f)))
        } else if code == NGHTTP2_NO_ERROR.rawValue && ex.status >= 200 {
            finished.append((ex, .success(ex.response)))
        } else if code == NGHTTP2_REFUSED_STREAM.rawValue && ex.status == 0 {
            refused.append((id, ex))
        } else {
            finished.append((ex, .failure(.other("stream closed: " + String(cString: nghttp2_http2_strerror(code))))))
        }
        if streams.isEmpty && pending.isEmpty { quietSince = .now }
    }

    /// After a frame was read: after a GOAWAY, what it says the server did
    /// not process, and what waited for a stream, goes again on another
    /// connection, while the streams it did take are answered on this one
    /// (failing them would send them twice); nghttp2 then wants nothing
    /// more, and `flush` closes it. A stream refused otherwise fails
    /// (sending it again at once could loop).
    private func sortOutRefusals() {
        let last = goAwayLastStream
        for (id, ex) in refused {
            if let last, id > last { unsent.append(ex) } else { finished.append((ex, .failure(.other("the server refused the stream")))) }
        }
        refused = []
        guard let last else { return }
        for (id, ex) in streams where id > last { unsent.append(ex); streams[id] = nil }
        retire()
    }

    /// No new stream here: what waits for one goes on another connection.
    private func retire() {
        retired = true
        unsent += pending
        pending = []
    }

    // MARK: I/O

    func handle(_ revents: Int16) {
        if state == .connecting {
            if revents != 0 { connected() }
            return
        }
        if revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { readSocket() }
        if state != .closed { flush() }
    }

    private func readSocket() {
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        var ended: String?
        buffer.withUnsafeMutableBytes { b in
            while ended == nil {
                let n = recv(fd, b.baseAddress, b.count, 0)
                if n > 0 { tls.received(UnsafeRawBufferPointer(rebasing: b[..<n])) } else {
                    if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) { break }
                    ended = n == 0 ? "the server closed the connection" : String(cString: strerror(errno))
                }
            }
            // What came before an EOF is read first: a GOAWAY, the last answers.
            if state == .handshaking { handshake() }
            while state == .ready, let session {
                guard let n = tls.read(into: b) else { ended = ended ?? "TLS: " + TLSContext.lastError(); break }
                guard n > 0 else { break }
                let used = nghttp2_session_mem_recv(session, b.baseAddress!.assumingMemoryBound(to: UInt8.self), n)
                if used < 0 { ended = "HTTP/2: " + String(cString: nghttp2_strerror(Int32(used))); break }
                sortOutRefusals()
            }
        }
        guard state != .closed else { return }
        if let ended { close(state == .handshaking ? .tls("handshake: \(ended)") : .other(ended)) } else { startStreams() }
    }

    /// Hands nghttp2's frames to TLS and TLS's bytes to the socket, until the
    /// socket takes no more or nghttp2 has nothing more: the socket's
    /// readiness is polled only while bytes wait in `output`.
    func flush() {
        var produced = 0
        repeat {
            produced = 0
            if state == .ready, let session {
                // Bounded, so that a slow peer does not make the buffer grow without end.
                while output.count - outputSent < 256 * 1024 {
                    var frames: UnsafePointer<UInt8>?
                    let n = nghttp2_session_mem_send(session, &frames)
                    if n < 0 { return close(.other("HTTP/2: " + String(cString: nghttp2_strerror(Int32(n))))) }
                    guard n > 0, let frames else { break }
                    produced += n
                    guard tls.write(UnsafeRawBufferPointer(start: frames, count: n)) else { return close(.other("TLS: " + TLSContext.lastError())) }
                    tls.take(into: &output)
                }
                let done = nghttp2_session_want_read(session) == 0 || (retired && streams.isEmpty)
                if done && nghttp2_session_want_write(session) == 0 && outputSent == output.count {
                    return close(.other("HTTP/2 session ended"))
                }
            }
            while outputSent < output.count {
                let n = output.withUnsafeBytes { send(fd, $0.baseAddress! + outputSent, $0.count - outputSent, Int32(MSG_NOSIGNAL)) }
                if n < 0 {
                    if errno == EAGAIN || errno == EWOULDBLOCK { return }
                    return close(.other(String(cString: strerror(errno))))
                }
                outputSent += n
            }
            output.removeAll(keepingCapacity: true)
            outputSent = 0
        } while produced > 0 && state == .ready && session.map { nghttp2_session_want_write($0) != 0 } == true
    }

    // MARK: Time

    /// Ends what is past its deadline; PINGs an idle connection, and closes one whose PING went unanswered.
    func tick(_ now: ContinuousClock.Instant) {
        guard state != .closed else { return }
        let late = pending.filter { $0.deadline <= now }
        if !late.isEmpty {
            pending.removeAll { $0.deadline <= now }
            for ex in late { finished.append((ex, .failure(.timedOut))) }
        }
        let timedOut = streams.filter { $0.value.deadline <= now }
        for (id, ex) in timedOut {
            streams[id] = nil
            if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, NGHTTP2_CANCEL.rawValue) }
            finished.append((ex, .failure(.timedOut)))
        }
        if state == .connecting && now - connectingSince >= Self.connectTimeout {
            Glibc.close(fd)
            fd = -1
            if let failure = connectNext(after: "no connection within \(Self.connectTimeout)") { return close(failure) }
        }
        guard state == .ready, let session else {
            // Connecting for no one: every request that waited for it timed out.
            if pending.isEmpty { close(.timedOut) }
            return
        }
        if let sent = pingSentAt {
            if now - sent >= limits.pingTimeout { return close(.other("no answer to a PING within \(limits.pingTimeout)")) }
        } else if !timedOut.isEmpty || (streams.isEmpty && pending.isEmpty && now - quietSince >= limits.pingInterval) {
            // Idle, or a stream went unanswered: is the peer still there? (Busy, a dead one would otherwise be
            // written to until TCP gives up, minutes later.)
            nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
            pingSentAt = now
        }
        startStreams()
    }

    /// When `tick` next has something to do.
    var nextDeadline: ContinuousClock.Instant? {
        guard state != .closed else { return nil }
        var next: ContinuousClock.Instant?
        func consider(_ d: ContinuousClock.Instant?) { if let d { next = min(next ?? d, d) } }
        consider(pending.lazy.map(\.deadline).min())
        consider(streams.values.lazy.map(\.deadline).min())
        if state == .connecting { consider(connectingSince + Self.connectTimeout) }
        if state == .ready {
            consider(pingSentAt.map { $0 + limits.pingTimeout }
                     ?? (streams.isEmpty && pending.isEmpty ? quietSince + limits.pingInterval : nil))
        }
        return next
    }

    /// The ack is traffic: the next PING is due an interval of quiet after it
    /// (so the server sees PINGs at least an interval apart, however late it read one).
    private func pingAcknowledged() {
        if pingSentAt != nil { quietSince = max(quietSince, .now) }
        pingSentAt = nil
    }

    // MARK: Closing

    /// Closes the connection: what is on the wire fails with `failure`; what
    /// waited for a stream goes again unless the connection never was ready
    /// (then it is the connection's failure) or the client stops.
    func close(_ failure: CurlFailure) {
        guard state != .closed else { return }
        let wasReady = state == .ready
        state = .closed
        for ex in streams.values { finished.append((ex, .failure(failure))) }
        for (_, ex) in refused { finished.append((ex, .failure(failure))) }
        streams = [:]
        refused = []
        if wasReady && failure != .stopped { unsent += pending } else { finished += pending.map { ($0, .failure(failure)) } }
        pending = []
        if let session { nghttp2_session_del(session) }
        session = nil
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    // MARK: nghttp2's callbacks, on the loop thread within mem_recv and mem_send

    private static func connection(_ user: UnsafeMutableRawPointer?) -> HTTP2Connection {
        Unmanaged<HTTP2Connection>.fromOpaque(user!).takeUnretainedValue()
    }

    private static let onHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, user in
        let c = connection(user)
        guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue), let ex = c.streams[frame.pointee.hd.stream_id],
              let name, let value else { return 0 }
        ex.headerBytes += nameLength + valueLength
        guard ex.headerBytes <= c.limits.maxResponseBytes else {
            ex.failure = .tooLarge
            // Resets the stream; its close callback gives the failure.
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
        }
        let n = String(decoding: UnsafeBufferPointer(start: name, count: nameLength), as: UTF8.self)
        let v = String(decoding: UnsafeBufferPointer(start: value, count: valueLength), as: UTF8.self)
        if n == ":status" {
            ex.status = Int(v) ?? 0
            ex.headers = [:]  // the final answer after a 1xx
        } else if !n.hasPrefix(":") {
            ex.headers[n] = v
        }
        return 0
    }

    private static let onData: nghttp2_on_data_chunk_recv_callback = { session, _, id, data, length, user in
        let c = connection(user)
        guard let ex = c.streams[id], ex.failure == nil, let data else { return 0 }
        guard ex.body.count + length <= c.limits.maxResponseBytes else {
            ex.failure = .tooLarge
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), id, NGHTTP2_CANCEL.rawValue)
            return 0
        }
        ex.body.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
        return 0
    }

    private static let onFrame: nghttp2_on_frame_recv_callback = { _, frame, user in
        let c = connection(user)
        guard let hd = frame?.pointee.hd else { return 0 }
        if hd.type == UInt8(NGHTTP2_PING.rawValue) && hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0 {
            c.pingAcknowledged()
        } else if hd.type == UInt8(NGHTTP2_GOAWAY.rawValue) {
            c.goAwayLastStream = frame!.pointee.goaway.last_stream_id
        }
        return 0
    }

    private static let onStreamClose: nghttp2_on_stream_close_callback = { _, id, code, user in
        connection(user).streamClosed(id, code: code)
        return 0
    }

    private static let readBody: nghttp2_data_source_read_callback = { _, id, buffer, length, flags, _, user in
        let c = connection(user)
        guard let ex = c.streams[id], let buffer, let flags else { return Int(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue) }
        let n = min(length, ex.request.body.count - ex.sent)
        ex.request.body.withUnsafeBytes { UnsafeMutableRawPointer(buffer).copyMemory(from: $0.baseAddress! + ex.sent, byteCount: n) }
        ex.sent += n
        if ex.sent == ex.request.body.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return n
    }
}
