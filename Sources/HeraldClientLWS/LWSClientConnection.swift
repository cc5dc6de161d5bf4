import CLibWebSockets
import HeraldClientTransport
import Foundation
import Synchronization

/// One libwebsockets client connection with its own context, serviced on a
/// thread of its own that ends with it: a device holds one or two
/// connections at a time, so this costs a thread each and keeps lws's
/// single-thread rule trivially true. Subclasses (`LWSChannel`, a WebSocket;
/// `LWSHTTPExchange`, one HTTP request) handle the callbacks.
///
/// `https`/`wss` verify the gateway's certificate chain and host name
/// against `caFile` (PEM); one that does not verify fails the connection,
/// and `certificateProblem` says why (lws's own error text does not).
class LWSClientConnection: @unchecked Sendable {  // thread-confined loop state; `context` behind a Mutex
    let endpoint: Endpoint
    private let caFile: String
    private let path: String
    /// nil: a WebSocket upgrade; else the HTTP method.
    private let method: String?
    private let timeoutSeconds: UInt32
    /// The context's address while it exists (0 otherwise), so that
    /// `lws_cancel_service` never races `lws_context_destroy`.
    private let context = Mutex<UInt>(0)
    private let threadName: String

    // Connection thread only.
    var wsi: OpaquePointer?
    var certificateProblem: String?
    private(set) var finished = false

    /// A library does not write to the app's stderr: what goes wrong is
    /// reported to the caller instead.
    private static let quietLogs: Void = lws_set_log_level(0, nil)

    init(endpoint: Endpoint, caFile: String, path: String, method: String?, timeout: Duration, threadName: String) {
        self.endpoint = endpoint
        self.caFile = caFile
        self.path = path
        self.method = method
        self.timeoutSeconds = UInt32(max(1, timeout.components.seconds))
        self.threadName = threadName
    }

    /// Starts the connection's thread; subclasses call it once set up.
    func start() {
        let thread = Thread { [self] in run() }
        thread.name = threadName
        thread.start()
    }

    /// Makes the loop call `wakeUp()` on its thread soon (safe from any thread).
    func wake() {
        context.withLock { if let ctx = OpaquePointer(bitPattern: $0) { lws_cancel_service(ctx) } }
    }

    /// Ends the service loop after the current callback.
    func endLoop() { finished = true }

    // MARK: Overridden by subclasses (connection thread)

    /// The connection could not be made or failed before it was up.
    /// `answered`: the server did answer, with an HTTP status the handshake
    /// did not accept (`status`, 0 when unknown).
    func failed(_ reason: String, answered: Bool = false, status: Int = 0) {}
    /// After `wake()`, and once the context exists.
    func wakeUp() {}
    /// nil: let lws's default handler take it.
    func handle(_ wsi: OpaquePointer, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
                _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32? { nil }

    // MARK: Connection thread

    private func run() {
        Self.quietLogs
        // C strings and tables lws keeps pointers to: they outlive the context.
        let name = strdup("herald-client")!, host = strdup(endpoint.host)!, path = strdup(path)!
        // The Host header carries a port other than the scheme's (lws drops
        // it again for the certificate's name check).
        let hostHeader = strdup(endpoint.port == (endpoint.secure ? 443 : 80) ? endpoint.host
                                : "\(endpoint.host):\(endpoint.port)")!
        // The gateway speaks HTTP/1.1 only; so does this client, whatever a TLS front offers.
        let alpn = strdup("http/1.1")!
        let method = method.map { strdup($0)! }
        let protocols = UnsafeMutablePointer<lws_protocols>.allocate(capacity: 2)
        let retry = UnsafeMutablePointer<lws_retry_bo_t>.allocate(capacity: 1)
        defer {
            for s in [name, host, hostHeader, alpn, path, method].compactMap({ $0 }) { free(s) }
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
        // TLS only for https/wss, with the trusted CAs loaded once per file:
        // loading a bundle took about 90 ms of CPU, per request.
        if endpoint.secure {
            guard let tls = Self.tlsContext(caFile: caFile) else {
                failed("the trusted certificates in \(caFile) could not be loaded")
                return
            }
            info.options = UInt64(LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT)
            info.provided_client_ssl_ctx = tls
        }
        // How long connecting, the TLS handshake and waiting for an HTTP answer may take.
        info.timeout_secs = timeoutSeconds
        info.user = Unmanaged.passUnretained(self).toOpaque()
        guard let ctx = lws_create_context(&info) else {
            failed("libwebsockets could not create a client context")
            return
        }
        context.withLock { $0 = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(ctx))) }

        var ci = lws_client_connect_info()
        ci.context = ctx
        ci.address = UnsafePointer(host)
        ci.host = UnsafePointer(hostHeader)
        ci.origin = UnsafePointer(host)
        ci.alpn = UnsafePointer(alpn)
        ci.port = Int32(endpoint.port)
        ci.path = UnsafePointer(path)
        ci.local_protocol_name = UnsafePointer(name)
        ci.ssl_connection = endpoint.secure ? Int32(LCCSCF_USE_SSL.rawValue) : 0
        if let method {
            ci.method = UnsafePointer(method)
            ci.ssl_connection |= Int32(LCCSCF_HTTP_NO_FOLLOW_REDIRECT.rawValue)
        } else {
            ci.retry_and_idle_policy = UnsafePointer(retry)
        }
        wsi = lws_client_connect_via_info(&ci)
        if wsi == nil { failed("could not connect to \(endpoint.host):\(endpoint.port)") }
        wakeUp()  // anything asked before the context existed

        while !finished {
            if lws_service(ctx, 0) < 0 { failed("the libwebsockets service failed") }
        }
        context.withLock { $0 = 0 }
        lws_context_destroy(ctx)
    }

    /// One OpenSSL client context per CA file, for the process's life (lws
    /// does not free a provided one): each connection's TLS verifies the
    /// chain against it and the host name on its own.
    private static let tlsContexts = Mutex<[String: UInt]>([:])

    private static func tlsContext(caFile: String) -> OpaquePointer? {
        tlsContexts.withLock { contexts in
            if let known = contexts[caFile] { return OpaquePointer(bitPattern: known) }
            guard let ctx = SSL_CTX_new(TLS_client_method()) else { return nil }
            guard SSL_CTX_load_verify_locations(ctx, caFile, nil) == 1 else {
                SSL_CTX_free(ctx)
                return nil
            }
            SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
            contexts[caFile] = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(ctx)))
            return ctx
        }
    }

    fileprivate func dispatch(_ wsi: OpaquePointer, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
                              _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32? {
        switch reason {
        case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION:
            // `length` is OpenSSL's preverify_ok, `user` its X509_STORE_CTX.
            // Returning 0 keeps OpenSSL's verdict.
            if length == 0, let store = user {
                certificateProblem = String(cString: X509_verify_cert_error_string(Int(X509_STORE_CTX_get_error(OpaquePointer(store)))))
            }
            return 0
        case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
            wakeUp()
            return 0
        case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
            let why = input.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) } ?? "connection failed"
            // lws's handshake errors ("HS: ...") mean an HTTP answer came.
            let answered = why.hasPrefix("HS:")
            let status = answered ? Int(lws_http_client_http_response(wsi)) : 0
            self.wsi = nil
            failed(certificateProblem.map { "the gateway's certificate was refused: \($0)" } ?? why,
                   answered: answered, status: status)
            return 0
        default:
            return handle(wsi, reason, user, input, length)
        }
    }
}

private func heraldClientCallback(_ wsi: OpaquePointer?, _ reason: lws_callback_reasons,
                                  _ user: UnsafeMutableRawPointer?, _ input: UnsafeMutableRawPointer?,
                                  _ length: Int) -> Int32 {
    if let wsi, let ctx = lws_get_context(wsi), let owner = lws_context_user(ctx) {
        let connection = Unmanaged<LWSClientConnection>.fromOpaque(owner).takeUnretainedValue()
        if let answer = connection.dispatch(wsi, reason, user, input, length) { return answer }
    }
    return lws_callback_http_dummy(wsi, reason, user, input, length)
}
