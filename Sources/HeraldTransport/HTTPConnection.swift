import CLibWebSockets
import HeraldCore
import HeraldGateway

/// One HTTP/1.1 connection on libwebsockets. Collects each request,
/// hands it to the gateway, and writes the answer when it comes back:
/// headers in one writable callback, the body in 64 KiB pieces after.
final class HTTPConnection: Flushable {
    private var wsi: OpaquePointer?
    unowned let loop: ServiceLoop
    /// Numbers requests on this connection, so a late answer to an earlier
    /// one is never written into a later exchange.
    private var serial = 0
    private var request: HTTPRequest?
    private var expectsBody = false
    private var response: HTTPResponse?
    private var headersSent = false
    private var bodyOffset = 0
    private var closeAfterResponse = false
    /// An answer is expected or being written.
    private(set) var isBusy = false
    /// A stream (Server-Sent Events): `streamOut` waits to be written.
    private var streaming = false
    private var streamOut: [UInt8] = []
    private var finishing = false
    private var closeHook: (() -> Void)?

    static let chunk = 65536

    init(wsi: OpaquePointer, loop: ServiceLoop) {
        self.wsi = wsi
        self.loop = loop
    }

    static func uri(_ wsi: OpaquePointer?) -> String {
        header(wsi, WSI_TOKEN_GET_URI) ?? ""
    }

    static func header(_ wsi: OpaquePointer?, _ token: lws_token_indexes) -> String? {
        let n = lws_hdr_total_length(wsi, token)
        guard n > 0, n < 65536 else { return nil }
        var buf = [CChar](repeating: 0, count: Int(n) + 1)
        guard lws_hdr_copy(wsi, &buf, Int32(buf.count), token) >= 0 else { return nil }
        return cString(buf)
    }

    static func customHeader(_ wsi: OpaquePointer?, _ name: String) -> String? {
        let key = name + ":"
        let n = key.withCString { lws_hdr_custom_length(wsi, $0, Int32(key.utf8.count)) }
        guard n > 0, n < 65536 else { return nil }
        var buf = [CChar](repeating: 0, count: Int(n) + 1)
        let r = key.withCString { lws_hdr_custom_copy(wsi, &buf, Int32(buf.count), $0, Int32(key.utf8.count)) }
        guard r >= 0 else { return nil }
        return cString(buf)
    }

    func begin(path: String) -> Int32 {
        guard let wsi else { return -1 }
        serial += 1
        response = nil
        headersSent = false
        bodyOffset = 0
        isBusy = true
        let methods: [(lws_token_indexes, String)] = [
            (WSI_TOKEN_GET_URI, "GET"), (WSI_TOKEN_POST_URI, "POST"), (WSI_TOKEN_PUT_URI, "PUT"),
            (WSI_TOKEN_PATCH_URI, "PATCH"), (WSI_TOKEN_DELETE_URI, "DELETE"), (WSI_TOKEN_OPTIONS_URI, "OPTIONS"),
            (WSI_TOKEN_HEAD_URI, "HEAD"),
        ]
        let found = methods.first(where: { lws_hdr_total_length(wsi, $0.0) > 0 })
        let method: String = found?.1 ?? "OTHER"
        var req = HTTPRequest(method: method, path: path)
        var frag = [CChar](repeating: 0, count: 4096)
        var i: Int32 = 0
        while lws_hdr_copy_fragment(wsi, &frag, Int32(frag.count), WSI_TOKEN_HTTP_URI_ARGS, i) > 0 {
            if let s = cString(frag) {
                let kv = s.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                req.query.append((String(kv[0]), kv.count > 1 ? String(kv[1]) : ""))
            }
            i += 1
        }
        req.headers["authorization"] = Self.header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION)
        req.headers["if-match"] = Self.header(wsi, WSI_TOKEN_HTTP_IF_MATCH)
        req.headers["content-type"] = Self.header(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE)
        req.headers["herald-device"] = Self.customHeader(wsi, "herald-device")
        req.headers["last-event-id"] = Self.customHeader(wsi, "last-event-id")
        request = req

        if Self.header(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) != nil {
            closeAfterResponse = true
            return answer(.error(HeraldError.badRequest("chunked request bodies are not supported; send Content-Length")))
        }
        let length: Int?? = Self.header(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH).map { Int($0) }
        if let length {
            guard let n = length, n >= 0 else {
                closeAfterResponse = true
                return answer(.error(HeraldError.badRequest("bad Content-Length")))
            }
            if n > loop.gateway.config.limits.maxBodyBytes {
                closeAfterResponse = true
                return answer(.error(HeraldError(.tooLarge, "request body larger than \(loop.gateway.config.limits.maxBodyBytes) bytes")))
            }
            // lws 4.1.6 ends a body with BODY_COMPLETION when it has bytes, and
            // for POST also when it is empty; other empty bodies get no call.
            expectsBody = n > 0 || method == "POST"
            request?.body.reserveCapacity(n)
        } else {
            expectsBody = false
        }
        if !expectsBody { dispatch() }
        return 0
    }

    func body(_ data: UnsafeRawBufferPointer) -> Int32 {
        guard expectsBody, request != nil else { return 0 }
        request!.body.append(contentsOf: data)
        return 0
    }

    func bodyComplete() -> Int32 {
        if expectsBody { dispatch() }
        return 0
    }

    private func dispatch() {
        guard let req = request else { return }
        request = nil
        expectsBody = false
        // Answers come back asynchronously (held polls after up to 60 s):
        // lws must not time the parked request out meanwhile.
        if let wsi { lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0) }
        loop.gateway.handle(req, shard: loop.shard, responder: Exchange(conn: self, serial: serial))
    }

    private func answer(_ r: HTTPResponse) -> Int32 {
        request = nil
        expectsBody = false
        respond(r, serial: serial)
        return 0
    }

    func respond(_ r: HTTPResponse, serial: Int) {
        guard wsi != nil, serial == self.serial, response == nil, isBusy else { return }
        response = r
        requestWrite()
    }

    private var flushQueued = false

    private func requestWrite() {
        if let wsi { loop.requestWrite(self, wsi: wsi, queued: &flushQueued) }
    }

    /// End of a drain: answer now if the socket takes it, else on writable.
    func flush() {
        flushQueued = false
        guard let wsi, response != nil else { return }
        if lws_send_pipe_choked(wsi) != 0 {
            lws_callback_on_writable(wsi)
            return
        }
        if writable() < 0 { lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC) }
    }

    /// Streams go out chunked, so clients that read in blocks still see
    /// each event as soon as it is written.
    func startStream(contentType: String, headers: [(String, String)], serial: Int) {
        guard wsi != nil, serial == self.serial, response == nil, !streaming, isBusy else { return }
        streaming = true
        response = HTTPResponse(status: 200, contentType: contentType, headers: headers + [("Transfer-Encoding", "chunked")], body: [])
        requestWrite()
    }

    func send(_ bytes: [UInt8], serial: Int) {
        guard wsi != nil, serial == self.serial, streaming, !finishing, !bytes.isEmpty else { return }
        streamOut += Array(String(bytes.count, radix: 16).utf8) + [0x0D, 0x0A] + bytes + [0x0D, 0x0A]
        requestWrite()
    }

    func finish(serial: Int) {
        guard wsi != nil, serial == self.serial, streaming, !finishing else { return }
        streamOut += Array("0\r\n\r\n".utf8)
        finishing = true
        requestWrite()
    }

    func queuedBytes(serial: Int) -> Int { serial == self.serial ? streamOut.count : 0 }

    private var drainWaiter: (below: Int, run: () -> Void)?

    func whenDrained(below bytes: Int, _ f: @escaping () -> Void, serial: Int) {
        guard serial == self.serial, wsi != nil else { return }
        if streamOut.count < bytes { return f() }
        drainWaiter = (bytes, f)
    }

    func onClose(_ f: @escaping () -> Void, serial: Int) {
        if serial == self.serial, wsi != nil { closeHook = f }
    }

    /// Headers go out in the same write as the first piece of the body: one
    /// `send()` for a typical answer (h1 writes are raw; lws keeps no count).
    func writable() -> Int32 {
        guard let wsi, let r = response else { return 0 }
        if streaming { return writeStream(wsi, r) }
        var out: [UInt8] = []
        if !headersSent {
            headersSent = true
            guard let h = headerBytes(wsi, r, length: lws_filepos_t(r.body.count)) else { return -1 }
            out = h
        }
        let end = min(r.body.count, bodyOffset + Self.chunk)
        let final = end == r.body.count
        out += r.body[bodyOffset..<end]
        if write(wsi, out, 0..<out.count, final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < 0 { return -1 }
        bodyOffset = end
        if !final {
            lws_callback_on_writable(wsi)
            return 0
        }
        response = nil
        isBusy = false
        closeHook = nil
        if closeAfterResponse { return -1 }
        return lws_http_transaction_completed(wsi) != 0 ? -1 : 0
    }

    private func writeStream(_ wsi: OpaquePointer, _ r: HTTPResponse) -> Int32 {
        var out: [UInt8] = []
        if !headersSent {
            headersSent = true
            // No length (LWS_ILLEGAL_HTTP_CONTENT_LEN): chunked, ends by closing.
            guard let h = headerBytes(wsi, r, length: lws_filepos_t.max) else { return -1 }
            out = h
        }
        let count = min(streamOut.count, Self.chunk)
        out += streamOut[0..<count]
        if !out.isEmpty {
            if write(wsi, out, 0..<out.count, LWS_WRITE_HTTP) < 0 { return -1 }
            streamOut.removeFirst(count)
            if let w = drainWaiter, streamOut.count < w.below {
                drainWaiter = nil
                w.run()
            }
        } else if finishing {
            return -1
        }
        if !streamOut.isEmpty || finishing { lws_callback_on_writable(wsi) }
        return 0
    }

    /// Writes `bytes[range]` through the loop's scratch buffer (LWS_PRE headroom).
    private func write(_ wsi: OpaquePointer, _ bytes: [UInt8], _ range: Range<Int>, _ kind: lws_write_protocol) -> Int32 {
        let pre = Int(herald_lws_pre)
        if loop.scratch.count < pre + range.count { loop.scratch = [UInt8](repeating: 0, count: pre + range.count) }
        return loop.scratch.withUnsafeMutableBufferPointer { buf -> Int32 in
            bytes.withUnsafeBufferPointer { b in
                if !range.isEmpty { (buf.baseAddress! + pre).update(from: b.baseAddress! + range.lowerBound, count: range.count) }
            }
            return lws_write(wsi, buf.baseAddress! + pre, range.count, kind)
        }
    }

    /// The status line and headers, ready to write.
    private func headerBytes(_ wsi: OpaquePointer, _ r: HTTPResponse, length: lws_filepos_t) -> [UInt8]? {
        var buf = [UInt8](repeating: 0, count: 2048)
        let n = buf.withUnsafeMutableBufferPointer { b -> Int in
            let start = b.baseAddress!
            var p: UnsafeMutablePointer<UInt8>? = start
            let end = start + b.count - 1
            if lws_add_http_common_headers(wsi, UInt32(r.status), r.contentType, length, &p, end) != 0 { return -1 }
            for (name, value) in r.headers {
                let key = name.lowercased() + ":"
                if lws_add_http_header_by_name(wsi, key, value, Int32(value.utf8.count), &p, end) != 0 { return -1 }
            }
            if lws_finalize_http_header(wsi, &p, end) != 0 { return -1 }
            return p! - start
        }
        return n < 0 ? nil : Array(buf[0..<n])
    }

    func closed() {
        wsi = nil
        drainWaiter = nil
        isBusy = false
        let hook = closeHook
        closeHook = nil
        hook?()
    }
}

/// A NUL-terminated buffer as a String, or nil if it is not UTF-8.
func cString(_ buf: [CChar]) -> String? {
    String(validating: buf.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// One request's way back to its connection.
final class Exchange: HTTPResponder, @unchecked Sendable {
    // Touched on the connection's loop thread only.
    private weak var conn: HTTPConnection?
    private let serial: Int

    init(conn: HTTPConnection, serial: Int) {
        self.conn = conn
        self.serial = serial
    }

    func respond(_ r: HTTPResponse) { conn?.respond(r, serial: serial) }
    func startStream(contentType: String, headers: [(String, String)]) {
        conn?.startStream(contentType: contentType, headers: headers, serial: serial)
    }
    func send(_ bytes: [UInt8]) { conn?.send(bytes, serial: serial) }
    func finish() { conn?.finish(serial: serial) }
    var queuedBytes: Int { conn?.queuedBytes(serial: serial) ?? 0 }
    func onClose(_ f: @escaping () -> Void) { conn?.onClose(f, serial: serial) }
    func whenDrained(below bytes: Int, _ f: @escaping () -> Void) { conn?.whenDrained(below: bytes, f, serial: serial) }
}
