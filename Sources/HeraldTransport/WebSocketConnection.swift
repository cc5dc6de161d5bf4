import CLibWebSockets
import HeraldGateway

/// A WebSocket on libwebsockets: reassembles messages for its session and
/// writes the session's frames, one per writable callback.
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
        session = loop.gateway.openWebSocket(shard: loop.shard, output: self)
    }

    private var flushQueued = false

    /// Queued frames merge into one per drain (see ServiceLoop.requestWrite).
    func requestWrite() {
        if let wsi { loop.requestWrite(self, wsi: wsi, queued: &flushQueued) }
    }

    /// End of a drain: write now if the socket takes it, else on writable.
    func flush() {
        flushQueued = false
        guard let wsi else { return }
        if session.closeRequest == nil, session.hasPendingOutput, lws_send_pipe_choked(wsi) == 0 {
            if writeFrame(wsi) < 0 {
                lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
                return
            }
        }
        if session.hasPendingOutput || session.closeRequest != nil { lws_callback_on_writable(wsi) }
    }

    private func writeFrame(_ wsi: OpaquePointer) -> Int32 {
        guard let frame = session.nextFrame() else { return 0 }
        let pre = Int(herald_lws_pre)
        if loop.scratch.count < pre + frame.count { loop.scratch = [UInt8](repeating: 0, count: pre + frame.count) }
        return loop.scratch.withUnsafeMutableBufferPointer { buf -> Int32 in
            frame.withUnsafeBufferPointer { f in
                (buf.baseAddress! + pre).update(from: f.baseAddress!, count: f.count)
            }
            return lws_write(wsi, buf.baseAddress! + pre, frame.count, LWS_WRITE_TEXT)
        }
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

    func writable() -> Int32 {
        guard let wsi else { return -1 }
        if session.hasPendingOutput {
            if writeFrame(wsi) < 0 { return -1 }
            if session.hasPendingOutput || session.closeRequest != nil { lws_callback_on_writable(wsi) }
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
