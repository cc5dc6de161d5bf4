import CLibWebSockets
import HeraldClientTransport
import Synchronization

/// One HTTP request and its answer over a connection of its own. The
/// answer's body is read whole (bounded by `maxBody`).
final class LWSHTTPExchange: LWSClientConnection, @unchecked Sendable {  // loop state on the connection's thread; `cancelled` behind a Mutex
    private let request: HTTPRequest
    private let cancelled = Mutex(false)

    // Connection thread only.
    private var answer: CheckedContinuation<HTTPResponse, any Error>?
    private var status = 0
    private var body: [UInt8] = []
    private var sentBody = false

    /// A history page of 500 notifications of 64 KiB each is 32 MiB.
    static let maxBody = 64 << 20

    static func send(_ request: HTTPRequest, to endpoint: Endpoint, caFile: String) async throws -> HTTPResponse {
        let exchange = LWSHTTPExchange(request, endpoint: endpoint, caFile: caFile)
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { c in
                exchange.answer = c  // before the thread starts, which alone uses it from then on
                exchange.start()
            }
        } onCancel: {
            exchange.cancelled.withLock { $0 = true }
            exchange.wake()
        }
    }

    private init(_ request: HTTPRequest, endpoint: Endpoint, caFile: String) {
        self.request = request
        super.init(endpoint: endpoint, caFile: caFile, path: endpoint.basePath + request.target,
                   method: request.method, timeout: request.timeout, threadName: "herald-client-http")
    }

    // MARK: Connection thread

    private func finish(_ result: Result<HTTPResponse, any Error>) {
        guard let answer else { return }
        self.answer = nil
        endLoop()
        answer.resume(with: result)
    }

    override func failed(_ reason: String, answered: Bool, status: Int) {
        finish(.failure(HeraldClientError.unreachable(reason)))
    }

    override func wakeUp() {
        if cancelled.withLock({ $0 }) { finish(.failure(CancellationError())) }
    }

    override func handle(_ wsi: OpaquePointer, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
                         _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32? {
        switch reason {
        case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER:
            // `input` is lws's `unsigned char **` write position, `length` the room left.
            guard let input else { return -1 }
            let p = input.assumingMemoryBound(to: UnsafeMutablePointer<UInt8>?.self)
            let end = p.pointee! + length
            var headers = request.headers
            if !request.body.isEmpty || request.method != "GET" {
                headers.append(("content-length", String(request.body.count)))
            }
            for (name, value) in headers {
                let added = "\(name.lowercased()):".withCString { n in
                    value.withCString { v in
                        lws_add_http_header_by_name(wsi, UnsafeRawPointer(n).assumingMemoryBound(to: UInt8.self),
                                                    UnsafeRawPointer(v).assumingMemoryBound(to: UInt8.self),
                                                    Int32(value.utf8.count), p, end)
                    }
                }
                if added != 0 { return -1 }
            }
            if !request.body.isEmpty {
                lws_client_http_body_pending(wsi, 1)
                lws_callback_on_writable(wsi)
            }
        case LWS_CALLBACK_CLIENT_HTTP_WRITEABLE:
            guard !sentBody else { return 0 }
            sentBody = true
            var frame = [UInt8](repeating: 0, count: Int(herald_lws_pre)) + request.body
            let written = frame.withUnsafeMutableBufferPointer {
                lws_write(wsi, $0.baseAddress! + Int(herald_lws_pre), request.body.count, LWS_WRITE_HTTP_FINAL)
            }
            lws_client_http_body_pending(wsi, 0)
            if written < request.body.count { return -1 }
        case LWS_CALLBACK_ESTABLISHED_CLIENT_HTTP:
            status = Int(lws_http_client_http_response(wsi))
            // The context's timeout covered connecting and the head; this bounds the body.
            lws_set_timeout(wsi, PENDING_TIMEOUT_HTTP_CONTENT, Int32(max(1, request.timeout.components.seconds)))
        case LWS_CALLBACK_RECEIVE_CLIENT_HTTP:
            // Pulls what arrived; lws calls back RECEIVE_CLIENT_HTTP_READ with it, unchunked.
            var buffer = [CChar](repeating: 0, count: Int(herald_lws_pre) + 16 * 1024)
            return buffer.withUnsafeMutableBufferPointer { b in
                var start: UnsafeMutablePointer<CChar>? = b.baseAddress! + Int(herald_lws_pre)
                var room = Int32(b.count - Int(herald_lws_pre))
                return lws_http_client_read(wsi, &start, &room) < 0 ? -1 : 0
            }
        case LWS_CALLBACK_RECEIVE_CLIENT_HTTP_READ:
            if let input { body.append(contentsOf: UnsafeRawBufferPointer(start: input, count: length)) }
            if body.count > Self.maxBody {
                finish(.failure(HeraldClientError.unreachable("the gateway's answer exceeded \(Self.maxBody >> 20) MiB")))
                return -1
            }
        case LWS_CALLBACK_COMPLETED_CLIENT_HTTP:
            finish(.success(HTTPResponse(status: status, body: body)))
        case LWS_CALLBACK_CLOSED_CLIENT_HTTP:
            self.wsi = nil
            finish(.failure(HeraldClientError.unreachable("the connection closed before the answer was complete")))
        case LWS_CALLBACK_WSI_DESTROY:
            // Covers a connection lws gave up on without one of the above.
            if wsi == self.wsi {
                self.wsi = nil
                finish(.failure(HeraldClientError.unreachable("the connection ended before the answer")))
            }
        default:
            return nil
        }
        return 0
    }
}
