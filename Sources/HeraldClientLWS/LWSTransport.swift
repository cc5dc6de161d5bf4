import CLibWebSockets
import HeraldClientTransport
import Foundation
import Synchronization

/// WebSockets and HTTP requests through the libwebsockets client API, each
/// connection on a thread of its own (`LWSClientConnection`).
///
/// `wss://` and `https://` verify the gateway's certificate chain and host
/// name against `caFile` (PEM), or OpenSSL's default bundle (the system
/// trust store on Debian) when nil. A certificate that does not verify
/// fails the connection (WebSocket: `.closed(code: 1006, reason:)`; HTTP:
/// `HeraldClientError.unreachable`), never silently accepted.
public struct LWSTransport: HeraldTransport {
    public var caFile: String?

    public init(caFile: String? = nil) { self.caFile = caFile }

    private var trustedCAs: String { caFile ?? String(cString: X509_get_default_cert_file()) }

    public func open(_ endpoint: Endpoint) -> any WebSocketChannel {
        LWSChannel(endpoint: endpoint, caFile: trustedCAs)
    }

    public func send(_ request: HTTPRequest, to endpoint: Endpoint) async throws -> HTTPResponse {
        try await LWSHTTPExchange.send(request, to: endpoint, caFile: trustedCAs)
    }
}

/// A WebSocket connection. Loop-thread state (`writes`, `message`, close
/// details) is touched only on the connection's thread; what other threads
/// touch is in `shared`.
final class LWSChannel: LWSClientConnection, WebSocketChannel, @unchecked Sendable {  // loop state is its thread's; what other threads touch is behind a Mutex
    struct Shared {
        var outbox: [String] = []
        var closeRequested = false
    }

    let events: AsyncStream<SocketEvent>
    private let continuation: AsyncStream<SocketEvent>.Continuation
    private let shared = Mutex(Shared())

    // Connection thread only.
    private var established = false
    private var writes: [[UInt8]] = []
    private var message: [UInt8] = []
    private var closeCode = 1006
    private var closeReason = "connection lost"

    /// The gateway's frames are at most 1 MiB (PROTOCOL.md 6.2); leave room.
    static let maxMessage = 2 << 20

    init(endpoint: Endpoint, caFile: String) {
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        super.init(endpoint: endpoint, caFile: caFile, path: endpoint.webSocketPath, method: nil,
                   timeout: .seconds(20), threadName: "herald-client-ws")
        start()
    }

    func send(_ text: String) {
        shared.withLock { $0.outbox.append(text) }
        wake()
    }

    func close() {
        shared.withLock { $0.closeRequested = true }
        wake()
    }

    // MARK: Connection thread

    /// Reports the connection's last event (`.closed` or `.refused`), once.
    private func finish(_ last: SocketEvent) {
        guard !finished else { return }
        endLoop()
        continuation.yield(last)
        continuation.finish()
    }

    override func failed(_ reason: String, answered: Bool, status: Int) {
        finish(answered ? .refused(status: status == 0 ? nil : status, reason: reason) : .closed(code: 1006, reason: reason))
    }

    override func wakeUp() { takeOutbox() }

    override func handle(_ wsi: OpaquePointer, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
                         _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32? {
        switch reason {
        case LWS_CALLBACK_CLIENT_ESTABLISHED:
            established = true
            continuation.yield(.open)
            takeOutbox()
        case LWS_CALLBACK_CLIENT_RECEIVE:
            guard wsi == self.wsi else { return 0 }
            if let input { message.append(contentsOf: UnsafeRawBufferPointer(start: input, count: length)) }
            if message.count > Self.maxMessage {
                closeCode = 1009; closeReason = "message too big"
                lws_close_reason(wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, nil, 0)
                return -1
            }
            if lws_is_final_fragment(wsi) != 0 {
                // Binary frames are not part of the protocol: skipped.
                if lws_frame_is_binary(wsi) == 0 { continuation.yield(.text(String(decoding: message, as: UTF8.self))) }
                message.removeAll(keepingCapacity: true)
            }
        case LWS_CALLBACK_CLIENT_WRITEABLE:
            guard wsi == self.wsi else { return 0 }
            if shared.withLock({ $0.closeRequested }) {
                closeCode = 1000; closeReason = "closed by the client"
                lws_close_reason(wsi, LWS_CLOSE_STATUS_NORMAL, nil, 0)
                return -1
            }
            guard !writes.isEmpty else { return 0 }
            var frame = writes.removeFirst()
            let payload = frame.count - Int(herald_lws_pre)
            let written = frame.withUnsafeMutableBufferPointer {
                lws_write(wsi, $0.baseAddress! + Int(herald_lws_pre), payload, LWS_WRITE_TEXT)
            }
            if written < payload { return -1 }
            if !writes.isEmpty { lws_callback_on_writable(wsi) }
        case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
            if let input, length >= 2 {
                let bytes = UnsafeRawBufferPointer(start: input, count: length)
                closeCode = Int(bytes[0]) << 8 | Int(bytes[1])
                closeReason = String(decoding: bytes.dropFirst(2), as: UTF8.self)
            }
        case LWS_CALLBACK_CLIENT_CLOSED:
            self.wsi = nil
            finish(.closed(code: closeCode, reason: closeReason))
        case LWS_CALLBACK_WSI_DESTROY:
            // Covers a connection lws gave up on without one of the above.
            if wsi == self.wsi {
                self.wsi = nil
                finish(.closed(code: closeCode, reason: closeReason))
            }
        default:
            return nil
        }
        return 0
    }

    /// Moves queued messages to the write list (framed with lws's headroom)
    /// and asks for a writable callback; a close before the connection was
    /// up simply ends it.
    private func takeOutbox() {
        let (texts, closing) = shared.withLock { s in
            defer { s.outbox.removeAll() }
            return (s.outbox, s.closeRequested)
        }
        if closing && !established {
            finish(.closed(code: 1000, reason: "closed by the client"))
            return
        }
        guard established, let wsi else { return }
        for t in texts { writes.append([UInt8](repeating: 0, count: Int(herald_lws_pre)) + Array(t.utf8)) }
        if !writes.isEmpty || closing { lws_callback_on_writable(wsi) }
    }
}
