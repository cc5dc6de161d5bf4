import CLibWebSockets
import Foundation
import Synchronization

/// WebSocket connections through the libwebsockets client API. Each
/// connection has its own lws context and service thread, which ends with
/// the connection: a device holds one connection, so this costs one thread
/// and keeps lws's single-thread rule trivially true.
///
/// `wss://` verifies the gateway's certificate chain and host name against
/// `caFile` (PEM), or OpenSSL's default bundle (the system trust store on
/// Debian) when nil. A certificate that does not verify fails the
/// connection (`.closed(code: 1006, reason: <lws's reason>)`).
public struct LWSTransport: WebSocketTransport {
    public var caFile: String?

    public init(caFile: String? = nil) { self.caFile = caFile }

    public func open(_ endpoint: Endpoint) -> any WebSocketChannel {
        LWSChannel(endpoint: endpoint, caFile: caFile ?? String(cString: X509_get_default_cert_file()))
    }
}

/// Loop-thread state (`wsi`, `writes`, `message`, close details) is touched
/// only on the connection's thread; what other threads touch is in `shared`.
final class LWSChannel: WebSocketChannel, @unchecked Sendable {  // see above: thread-confined state plus a Mutex
    struct Shared {
        var outbox: [String] = []
        var closeRequested = false
        /// The context's address while it exists (0 otherwise), so that
        /// `lws_cancel_service` never races `lws_context_destroy`.
        var context: UInt = 0
    }

    let events: AsyncStream<SocketEvent>
    private let continuation: AsyncStream<SocketEvent>.Continuation
    private let shared = Mutex(Shared())
    private let endpoint: Endpoint
    private let caFile: String

    // Connection thread only.
    private var wsi: OpaquePointer?
    private var established = false
    private var writes: [[UInt8]] = []
    private var message: [UInt8] = []
    private var closeCode = 1006
    private var closeReason = "connection lost"
    /// Why OpenSSL refused the gateway's certificate, for the error
    /// (lws's own connection error text does not say).
    private var certificateProblem: String?
    private var finished = false

    /// The gateway's frames are at most 1 MiB (PROTOCOL.md 6.2); leave room.
    static let maxMessage = 2 << 20
    /// A library does not write to the app's stderr: what goes wrong is
    /// reported in `.closed` reasons instead.
    private static let quietLogs: Void = lws_set_log_level(0, nil)

    init(endpoint: Endpoint, caFile: String) {
        self.endpoint = endpoint
        self.caFile = caFile
        (events, continuation) = AsyncStream.makeStream(bufferingPolicy: .unbounded)
        let thread = Thread { [self] in run() }
        thread.name = "herald-client-ws"
        thread.start()
    }

    func send(_ text: String) {
        wake { $0.outbox.append(text) }
    }

    func close() {
        wake { $0.closeRequested = true }
    }

    private func wake(_ change: (inout Shared) -> Void) {
        shared.withLock { s in
            change(&s)
            if let ctx = OpaquePointer(bitPattern: s.context) { lws_cancel_service(ctx) }
        }
    }

    // MARK: Connection thread

    private func run() {
        Self.quietLogs
        // C strings and tables lws keeps pointers to: they outlive the context.
        let name = strdup("herald-client")!, host = strdup(endpoint.host)!, path = strdup(endpoint.path)!
        let ca = strdup(caFile)!
        let protocols = UnsafeMutablePointer<lws_protocols>.allocate(capacity: 2)
        let retry = UnsafeMutablePointer<lws_retry_bo_t>.allocate(capacity: 1)
        defer {
            for s in [name, host, path, ca] { free(s) }
            protocols.deallocate()
            retry.deallocate()
        }
        protocols.initialize(repeating: lws_protocols(), count: 2)
        protocols[0].name = UnsafePointer(name)
        protocols[0].callback = heraldClientCallback
        protocols[0].rx_buffer_size = 64 * 1024
        // The gateway pings after 30 s of silence; these catch a gateway
        // that vanished without a FIN, where TCP alone would wait minutes.
        retry.initialize(to: lws_retry_bo_t())
        retry.pointee.secs_since_valid_ping = 20
        retry.pointee.secs_since_valid_hangup = 40

        var info = lws_context_creation_info()
        info.port = CONTEXT_PORT_NO_LISTEN
        info.protocols = UnsafePointer(protocols)
        info.gid = -1
        info.uid = -1
        info.options = UInt64(LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT)
        info.client_ssl_ca_filepath = UnsafePointer(ca)
        info.user = Unmanaged.passUnretained(self).toOpaque()
        guard let ctx = lws_create_context(&info) else {
            finish(code: 1006, reason: "libwebsockets could not create a client context")
            return
        }
        shared.withLock { $0.context = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(ctx))) }

        var ci = lws_client_connect_info()
        ci.context = ctx
        ci.address = UnsafePointer(host)
        ci.host = UnsafePointer(host)
        ci.origin = UnsafePointer(host)
        ci.port = Int32(endpoint.port)
        ci.path = UnsafePointer(path)
        ci.local_protocol_name = UnsafePointer(name)
        ci.ssl_connection = endpoint.secure ? Int32(LCCSCF_USE_SSL.rawValue) : 0
        ci.retry_and_idle_policy = UnsafePointer(retry)
        wsi = lws_client_connect_via_info(&ci)
        if wsi == nil { finish(code: 1006, reason: "could not connect to \(endpoint.host):\(endpoint.port)") }

        while !finished {
            if lws_service(ctx, 0) < 0 { finish(code: 1006, reason: "the libwebsockets service failed") }
        }
        shared.withLock { $0.context = 0 }
        lws_context_destroy(ctx)
    }

    private func finish(code: Int, reason: String) {
        guard !finished else { return }
        finished = true
        continuation.yield(.closed(code: code, reason: reason))
        continuation.finish()
    }

    /// nil: let lws's default handler take it.
    fileprivate func handle(_ wsi: OpaquePointer, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
                            _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32? {
        switch reason {
        case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
            // `length` is OpenSSL's preverify_ok, `user` its X509_STORE_CTX.
            // Returning 0 keeps OpenSSL's verdict.
            if length == 0, let store = user {
                certificateProblem = String(cString: X509_verify_cert_error_string(Int(X509_STORE_CTX_get_error(OpaquePointer(store)))))
            }
        case LWS_CALLBACK_CLIENT_ESTABLISHED:
            established = true
            continuation.yield(.open)
            takeOutbox()
        case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
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
        case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
            let why = input.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) } ?? "connection failed"
            self.wsi = nil
            finish(code: 1006, reason: certificateProblem.map { "the gateway's certificate was refused: \($0)" } ?? why)
        case LWS_CALLBACK_CLIENT_CLOSED:
            self.wsi = nil
            finish(code: closeCode, reason: closeReason)
        case LWS_CALLBACK_WSI_DESTROY:
            // Covers a connection lws gave up on without one of the above.
            if wsi == self.wsi {
                self.wsi = nil
                finish(code: closeCode, reason: closeReason)
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
            finish(code: 1000, reason: "closed by the client")
            return
        }
        guard established, let wsi else { return }
        for t in texts { writes.append([UInt8](repeating: 0, count: Int(herald_lws_pre)) + Array(t.utf8)) }
        if !writes.isEmpty || closing { lws_callback_on_writable(wsi) }
    }
}

private func heraldClientCallback(_ wsi: OpaquePointer?, _ reason: lws_callback_reasons,
                                  _ user: UnsafeMutableRawPointer?, _ input: UnsafeMutableRawPointer?,
                                  _ length: Int) -> Int32 {
    if let wsi, let ctx = lws_get_context(wsi), let owner = lws_context_user(ctx) {
        let channel = Unmanaged<LWSChannel>.fromOpaque(owner).takeUnretainedValue()
        if let answer = channel.handle(wsi, reason, user, input, length) { return answer }
    }
    return lws_callback_http_dummy(wsi, reason, user, input, length)
}
