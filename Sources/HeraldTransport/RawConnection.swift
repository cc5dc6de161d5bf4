import CLibWebSockets
import Glibc

/// What lives on an lws raw socket: an HTTP connection, or the WebSocket it
/// became. lws accepts, runs TLS and reads; Herald frames and writes.
protocol RawConnection: AnyObject {
    func receive(_ data: UnsafeRawBufferPointer)
    /// The socket has room, or lws sent what it held for us. Non-zero closes.
    func writable() -> Int32
    func closed()
}

enum SocketWrite {
    case wrote(Int)
    /// The socket takes nothing now: wait until it is writable.
    case full
    case failed
}

/// Writes to a connection's socket, through its TLS session if it has one.
/// Straight to the socket, not through lws_write (which holds what the
/// socket did not take where Herald cannot see it go): every byte taken is
/// progress the caller sees.
func writeSocket(_ wsi: OpaquePointer, _ bytes: UnsafeRawBufferPointer) -> SocketWrite {
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

/// Closes a connection from lws's side, after the current callback.
func closeSoon(_ wsi: OpaquePointer) {
    lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
}
