import CLibWebSockets
import HeraldCore
import HeraldGateway

/// One HTTP/1.1 connection on libwebsockets. Collects each request,
/// hands it to the gateway, and writes the answer when it comes back:
/// headers in one writable callback, the body in 64 KiB pieces after.
final class HTTPConnection {
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
            expectsBody = n > 0
            if n > 0 { request?.body.reserveCapacity(n) }
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
        loop.gateway.handle(req, shard: loop.shard, responder: Exchange(conn: self, serial: serial))
    }

    private func answer(_ r: HTTPResponse) -> Int32 {
        request = nil
        expectsBody = false
        respond(r, serial: serial)
        return 0
    }

    func respond(_ r: HTTPResponse, serial: Int) {
        guard let wsi, serial == self.serial, response == nil, isBusy else { return }
        response = r
        lws_callback_on_writable(wsi)
    }

    func writable() -> Int32 {
        guard let wsi, let r = response else { return 0 }
        if !headersSent {
            headersSent = true
            if writeHeaders(wsi, r) != 0 { return -1 }
            lws_callback_on_writable(wsi)
            return 0
        }
        let end = min(r.body.count, bodyOffset + Self.chunk)
        let final = end == r.body.count
        let pre = Int(herald_lws_pre)
        let count = end - bodyOffset
        if loop.scratch.count < pre + count { loop.scratch = [UInt8](repeating: 0, count: pre + count) }
        let n = loop.scratch.withUnsafeMutableBufferPointer { buf -> Int32 in
            r.body.withUnsafeBufferPointer { b in
                if count > 0 { (buf.baseAddress! + pre).update(from: b.baseAddress! + bodyOffset, count: count) }
            }
            return lws_write(wsi, buf.baseAddress! + pre, count, final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP)
        }
        if n < 0 { return -1 }
        bodyOffset = end
        if !final {
            lws_callback_on_writable(wsi)
            return 0
        }
        response = nil
        isBusy = false
        if closeAfterResponse { return -1 }
        return lws_http_transaction_completed(wsi) != 0 ? -1 : 0
    }

    private func writeHeaders(_ wsi: OpaquePointer, _ r: HTTPResponse) -> Int32 {
        let pre = Int(herald_lws_pre)
        var buf = [UInt8](repeating: 0, count: pre + 2048)
        return buf.withUnsafeMutableBufferPointer { b -> Int32 in
            let start = b.baseAddress! + pre
            var p: UnsafeMutablePointer<UInt8>? = start
            let end = b.baseAddress! + b.count - 1
            if lws_add_http_common_headers(wsi, UInt32(r.status), r.contentType, lws_filepos_t(r.body.count), &p, end) != 0 {
                return -1
            }
            for (name, value) in r.headers {
                let key = name.lowercased() + ":"
                if lws_add_http_header_by_name(wsi, key, value, Int32(value.utf8.count), &p, end) != 0 { return -1 }
            }
            if lws_finalize_write_http_header(wsi, start, &p, end) != 0 { return -1 }
            return 0
        }
    }

    /// Shutdown: nothing to do for a plain request; its answer is on the way.
    func shutdown() {}

    func closed() {
        wsi = nil
        isBusy = false
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
}
