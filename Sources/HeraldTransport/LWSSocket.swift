import CLibWebSockets
import Glibc

/// A connection's lws raw socket: the only place a connection calls
/// libwebsockets (Protocols.swift adopts and dispatches, ServiceLoop runs
/// the context).
final class LWSSocket: ConnectionSocket {
    private let wsi: OpaquePointer
    private unowned let loop: ServiceLoop

    init(_ wsi: OpaquePointer, loop: ServiceLoop) {
        self.wsi = wsi
        self.loop = loop
    }

    /// Through the TLS session if there is one. Straight to the socket, not
    /// through lws_write (which holds what the socket did not take where
    /// Herald cannot see it go).
    func write(_ bytes: UnsafeRawBufferPointer) -> SocketWrite {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return .wrote(0) }
        if let ssl = lws_get_ssl(wsi) {
            let n = herald_tls_write(ssl, base, Int32(min(bytes.count, Int(Int32.max))))
            return n > 0 ? .wrote(Int(n)) : n == 0 ? .full : .failed
        }
        while true {
            let n = send(lws_get_socket_fd(wsi), base, bytes.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT))
            if n >= 0 { return n == 0 ? .full : .wrote(n) }
            if errno == EINTR { continue }
            return errno == EAGAIN || errno == EWOULDBLOCK ? .full : .failed
        }
    }

    /// Has lws send `bytes` ahead of anything written after them (its raw
    /// write), then call `writable()`. False when the socket failed.
    func hold(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return true }
        return lws_write(wsi, UnsafeMutablePointer(mutating: base.assumingMemoryBound(to: UInt8.self)), bytes.count, LWS_WRITE_HTTP) >= 0
    }

    func wantWritable() { lws_callback_on_writable(wsi) }

    func setReading(_ on: Bool) { lws_rx_flow_control(wsi, on ? 1 : 0) }

    /// Not under TLS: lws ends the session when it closes.
    func shutdownWrite() {
        if lws_get_ssl(wsi) == nil { _ = Glibc.shutdown(lws_get_socket_fd(wsi), Int32(SHUT_WR)) }
    }

    func close() { closeSoon(wsi) }

    /// Closes the connection unless it closed within `seconds` (a WebSocket
    /// waiting for the answer to its close frame).
    func closeUnlessClosed(within seconds: Int32) { lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_ACK, seconds) }

    func upgrade(handshake: [UInt8], origin: String?, early: [UInt8]) {
        let ws = WebSocketConnection(socket: self, loop: loop, handshake: handshake, origin: origin)
        Protocols.replaceAttached(wsi, with: ws)
        loop.webSockets[ObjectIdentifier(ws)] = ws
        if !early.isEmpty { early.withUnsafeBytes { ws.receive($0) } }
    }
}

/// Closes an lws connection (or the listener) after the current callback.
func closeSoon(_ wsi: OpaquePointer) {
    lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
}
