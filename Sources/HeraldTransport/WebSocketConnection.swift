import HeraldGateway

/// A WebSocket on an lws raw socket, after the handshake `HTTPConnection`
/// answered: reads the client's frames for its session, writes the
/// session's frames (as many to a write as are queued) and closes with the
/// close handshake (RFC 6455 section 7).
final class WebSocketConnection: WebSocketOutput, Flushable, RawConnection {
    /// Nil once the socket closed.
    private var socket: LWSSocket?
    unowned let loop: ServiceLoop
    private(set) var session: WebSocketSession!
    private var reader: WebSocketFrameReader
    private var flushQueued = false
    /// lws holds the unsent tail of our last write and calls `writable()`
    /// once it has sent it; until then nothing may be sent past it.
    private var lwsHoldsOutput = false
    private var closeSent = false

    /// How long the client has to answer our close frame with its own.
    static let closeAckSeconds: Int32 = 5

    /// `handshake`: the `101` head, written first; `origin`: the upgrade's
    /// `Origin`, which the session checks against the token's app.
    init(socket: LWSSocket, loop: ServiceLoop, handshake: [UInt8], origin: String?) {
        self.socket = socket
        self.loop = loop
        reader = WebSocketFrameReader(maxMessage: loop.gateway.config.limits.maxMessageBytes)
        session = loop.gateway.openWebSocket(shard: loop.shard, transport: self, origin: origin)
        if !handshake.withUnsafeBytes({ write($0, socket) }) { socket.close() }
    }

    func receive(_ data: UnsafeRawBufferPointer) {
        loop.owner.preconditionCurrent()
        guard socket != nil else { return }
        session.heard()
        reader.read(data) { event in
            switch event {
            case .text(let bytes): session.receive(.text(bytes))
            case .binary: session.receive(.binary)
            case .tooBig: session.receive(.tooBig)
            case .ping(let payload): session.ping(payload)
            case .pong: session.pong()
            case .close(let body):
                // The answer to ours ends the connection; else ours answers it.
                if closeSent { hangUp() } else { session.receive(.close(body)) }
            case .protocolError(let why): session.receive(.protocolError(why))
            }
        }
    }

    /// Queued frames merge into one write per drain (see ServiceLoop.requestWrite,
    /// which checks the thread).
    func requestWrite() {
        if let socket { loop.requestWrite(self, socket: socket, queued: &flushQueued) }
    }

    func hangUp() {
        loop.owner.preconditionCurrent()
        socket?.close()
    }

    /// End of a drain (`ServiceLoop.drainInbox`, which checks the thread):
    /// write what the session has queued, now.
    func flush() {
        flushQueued = false
        guard let socket, !lwsHoldsOutput else { return }
        if !writePending(socket) { socket.close() }
    }

    /// lws calls this when the socket has room, and once it has sent what it
    /// held for us.
    func writable() -> Int32 {
        loop.owner.preconditionCurrent()
        guard let socket else { return -1 }
        lwsHoldsOutput = false
        return writePending(socket) ? 0 : -1
    }

    /// Writes every queued frame, then (once nothing is left) the close
    /// frame the session asked for. False when the connection is to close
    /// now: the socket failed, or the close handshake is done.
    private func writePending(_ socket: LWSSocket) -> Bool {
        var rounds = 0
        while session.hasPendingOutput {
            guard rounds < 4 else {
                socket.wantWritable()
                return true
            }
            rounds += 1
            loop.output.removeAll(keepingCapacity: true)
            session.writePending(into: &loop.output, limit: ServiceLoop.outputLimit)
            guard loop.output.withUnsafeBytes({ write($0, socket) }) else { return false }
            if lwsHoldsOutput { return true }
        }
        guard let close = session.closeRequest else { return true }
        if !closeSent {
            closeSent = true
            loop.output.removeAll(keepingCapacity: true)
            WebSocketOutbox.appendClose(code: close.code.rawValue, reason: close.reason, to: &loop.output)
            guard loop.output.withUnsafeBytes({ write($0, socket) }) else { return false }
            if lwsHoldsOutput { return true }
        }
        // Ours is out: wait for the client's close frame, unless it came
        // already (or its frames are no longer read).
        guard !reader.stopped else { return false }
        socket.closeUnlessClosed(within: Self.closeAckSeconds)
        return true
    }

    /// Writes `bytes`; what the socket does not take now lws holds and
    /// sends ahead of anything else (`LWS_WRITE_HTTP` is its raw write), so
    /// frames never interleave. False when the socket failed.
    private func write(_ bytes: UnsafeRawBufferPointer, _ socket: LWSSocket) -> Bool {
        var done = 0
        switch socket.write(bytes) {
        case .wrote(let n) where n == bytes.count: return true
        case .wrote(let n): done = n
        case .full: break
        case .failed: return false
        }
        lwsHoldsOutput = true
        return socket.hold(UnsafeRawBufferPointer(rebasing: bytes[done...]))
    }

    /// From `ServiceLoop.closed`, which checks the thread.
    func closed() {
        socket = nil
        session.transportClosed()
    }
}
