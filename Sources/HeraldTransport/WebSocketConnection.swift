import CLibWebSockets
import Glibc
import HeraldGateway

/// A WebSocket on libwebsockets: reassembles messages for its session and
/// writes the session's frames, as many to a `send()` as are queued.
final class WebSocketConnection: WebSocketOutput, Flushable {
    private var wsi: OpaquePointer?
    unowned let loop: ServiceLoop
    private(set) var session: WebSocketSession!
    private var rx: [UInt8] = []
    /// Dropping the rest of a message that was too big or binary.
    private var discarding = false

    init(wsi: OpaquePointer, loop: ServiceLoop) {
        self.wsi = wsi
        self.loop = loop
        session = loop.gateway.openWebSocket(shard: loop.shard, transport: self)
    }

    private var flushQueued = false
    /// lws holds the unsent tail of our last write and calls `writable()`
    /// once it has sent it; until then nothing may be sent past it.
    private var lwsHoldsOutput = false

    /// Queued frames merge into one write per drain (see ServiceLoop.requestWrite).
    func requestWrite() {
        if let wsi { loop.requestWrite(self, wsi: wsi, queued: &flushQueued) }
    }

    /// End of a drain: write what the session has queued, now.
    func flush() {
        flushQueued = false
        guard let wsi else { return }
        if !lwsHoldsOutput, session.closeRequest == nil, !writePending(wsi) {
            lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
            return
        }
        writeLater(wsi)
    }

    /// Asks for a writable callback when output or a close is left, unless
    /// lws holds output: it calls back anyway once that is sent.
    private func writeLater(_ wsi: OpaquePointer) {
        if !lwsHoldsOutput, session.hasPendingOutput || session.closeRequest != nil { lws_callback_on_writable(wsi) }
    }

    /// Writes every queued message, several frames to a `send()`, straight to
    /// the socket: no `lws_send_pipe_choked` (a `poll()` per call) and no
    /// writable round trip (two `epoll_ctl`) while the socket takes it all.
    /// A short send hands the rest to lws (`LWS_WRITE_HTTP` is its
    /// `LWS_WRITE_RAW`: bytes as they are, no framing), which sends it
    /// ahead of anything else, its own pongs and close frame included, so
    /// frames never interleave. False when the socket failed.
    private func writePending(_ wsi: OpaquePointer) -> Bool {
        let fd = lws_get_socket_fd(wsi)
        var rounds = 0
        while session.hasPendingOutput, rounds < 4 {
            rounds += 1
            loop.output.removeAll(keepingCapacity: true)
            session.writePending(into: &loop.output, limit: ServiceLoop.outputLimit)
            let total = loop.output.count
            let sent = loop.output.withUnsafeBytes { send(fd, $0.baseAddress, total, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
            if sent == total { continue }
            if sent < 0, errno != EAGAIN, errno != EWOULDBLOCK { return false }
            let done = max(sent, 0)
            lwsHoldsOutput = true
            return loop.output.withUnsafeMutableBufferPointer { b in
                lws_write(wsi, b.baseAddress! + done, total - done, LWS_WRITE_HTTP) >= 0
            }
        }
        return true
    }

    func receive(_ data: UnsafeRawBufferPointer) {
        guard let wsi else { return }
        let first = lws_is_first_fragment(wsi) != 0
        let final = lws_is_final_fragment(wsi) != 0 && lws_remaining_packet_payload(wsi) == 0
        if first && rx.isEmpty { discarding = false }
        if !discarding {
            if lws_frame_is_binary(wsi) != 0 {
                discarding = true
                session.receive(.binary)
            } else if rx.count + data.count > loop.gateway.config.limits.maxMessageBytes {
                discarding = true
                rx = []
                session.receive(.tooBig)
            } else {
                rx.append(contentsOf: data)
            }
        }
        if final {
            if !discarding { session.receive(.text(rx)) }
            rx = []
            discarding = false
        }
    }

    /// lws calls this only once it has sent what it held for us.
    func writable() -> Int32 {
        guard let wsi else { return -1 }
        lwsHoldsOutput = false
        if session.hasPendingOutput {
            if !writePending(wsi) { return -1 }
            writeLater(wsi)
            return 0
        }
        if let c = session.closeRequest {
            var reason = Array(c.reason.utf8)
            lws_close_reason(wsi, lws_close_status(rawValue: UInt32(c.code.rawValue)), &reason, reason.count)
            return -1
        }
        return 0
    }

    func closed() {
        wsi = nil
        session.transportClosed()
    }
}
