import CSSL
import HeraldCurl

/// A client's TLS settings, shared by its connections: TLS 1.2 or later,
/// the peer's certificate checked against `caFile` or the system's default
/// CAs, ALPN offering "h2" alone.
final class TLSContext {
    let ctx: OpaquePointer

    init(caFile: String?) throws(CurlFailure) {
        guard let ctx = SSL_CTX_new(TLS_client_method()) else { throw .tls("SSL_CTX_new: " + TLSContext.lastError()) }
        self.ctx = ctx
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nil)
        guard herald_ssl_ctx_min_tls12(ctx) == 1 else { throw .tls("cannot require TLS 1.2: " + Self.lastError()) }
        let trusted = caFile.map { SSL_CTX_load_verify_locations(ctx, $0, nil) } ?? SSL_CTX_set_default_verify_paths(ctx)
        guard trusted == 1 else { throw .tls("cannot load CAs from \(caFile ?? "the system's default paths"): " + Self.lastError()) }
        // The wire form: each protocol's length, then its name. OpenSSL copies it.
        let alpn: [UInt8] = [2, UInt8(ascii: "h"), UInt8(ascii: "2")]
        // SSL_CTX_set_alpn_protos returns 0 on success.
        guard SSL_CTX_set_alpn_protos(ctx, alpn, UInt32(alpn.count)) == 0 else { throw .tls("cannot offer ALPN h2") }
    }

    deinit { SSL_CTX_free(ctx) }

    /// OpenSSL's account of the calling thread's last error, which it clears.
    static func lastError() -> String {
        let code = ERR_get_error()
        ERR_clear_error()
        guard code != 0 else { return "unknown error" }
        var text = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &text, text.count)
        return text.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
    }
}
