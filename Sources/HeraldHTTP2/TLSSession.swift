import CSSL
import Glibc
import HeraldCurl

/// TLS for one connection over memory BIOs: the connection moves the bytes
/// between them and its socket itself, with MSG_NOSIGNAL, so that a peer
/// gone raises no SIGPIPE in a process that did not ignore it.
final class TLSSession {
    private let ssl: OpaquePointer
    /// Owned by `ssl`: what came from the peer, what is to go to it.
    private let incoming: OpaquePointer
    private let outgoing: OpaquePointer

    enum Step { case done, wantRead, failed(CurlFailure) }

    /// Verifies the peer as `host`: a DNS name (sent as SNI too) or an IP address.
    init(_ context: TLSContext, host: String) throws(CurlFailure) {
        guard let ssl = SSL_new(context.ctx) else { throw .tls("SSL_new: " + TLSContext.lastError()) }
        self.ssl = ssl
        let incoming = BIO_new(BIO_s_mem()), outgoing = BIO_new(BIO_s_mem())
        guard let incoming, let outgoing else {
            BIO_free(incoming)  // either may be nil, which BIO_free takes
            BIO_free(outgoing)
            SSL_free(ssl)
            throw .tls("BIO_new failed")
        }
        self.incoming = incoming; self.outgoing = outgoing
        SSL_set_bio(ssl, incoming, outgoing)
        SSL_set_connect_state(ssl)
        // OpenSSL copies the names given here: they need not outlive the calls.
        var address = in6_addr()
        let literal = inet_pton(AF_INET, host, &address) == 1 || inet_pton(AF_INET6, host, &address) == 1
        // RFC 6066: no SNI for an address.
        let named = literal ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1
            : SSL_set1_host(ssl, host) == 1 && herald_ssl_set_sni(ssl, host) == 1
        guard named else { throw .tls("cannot verify the peer as \(host): " + TLSContext.lastError()) }
    }

    deinit { SSL_free(ssl) }

    func handshake() -> Step {
        ERR_clear_error()
        let r = SSL_do_handshake(ssl)
        if r == 1 {
            var proto: UnsafePointer<UInt8>?
            var length: UInt32 = 0
            SSL_get0_alpn_selected(ssl, &proto, &length)
            let selected = proto.map { String(decoding: UnsafeBufferPointer(start: $0, count: Int(length)), as: UTF8.self) }
            return selected == "h2" ? .done : .failed(.tls("the server did not choose h2 by ALPN (\(selected ?? "none"))"))
        }
        if SSL_get_error(ssl, r) == SSL_ERROR_WANT_READ { return .wantRead }
        let verified = SSL_get_verify_result(ssl)
        if verified != X509_V_OK { return .failed(.tls(String(cString: X509_verify_cert_error_string(verified)))) }
        return .failed(.tls(TLSContext.lastError()))
    }

    /// Takes bytes that came from the peer.
    func received(_ bytes: UnsafeRawBufferPointer) {
        // A memory BIO takes everything it is given.
        _ = BIO_write(incoming, bytes.baseAddress, Int32(bytes.count))
    }

    /// Plaintext read into `buffer`: its length, 0 when nothing is readable
    /// yet, nil when the peer closed TLS or it failed.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int? {
        ERR_clear_error()
        let n = SSL_read(ssl, buffer.baseAddress, Int32(buffer.count))
        if n > 0 { return Int(n) }
        return SSL_get_error(ssl, n) == SSL_ERROR_WANT_READ ? 0 : nil
    }

    /// Encrypts all of `bytes`; false when TLS failed.
    func write(_ bytes: UnsafeRawBufferPointer) -> Bool {
        ERR_clear_error()
        // Into a memory BIO, which grows: the whole buffer goes at once.
        return SSL_write(ssl, bytes.baseAddress, Int32(bytes.count)) == Int32(bytes.count)
    }

    /// Moves what is to go to the peer to the end of `output`.
    func take(into output: inout [UInt8]) {
        let pending = Int(BIO_ctrl_pending(outgoing))
        guard pending > 0 else { return }
        let start = output.count
        output.append(contentsOf: repeatElement(0, count: pending))
        let n = output.withUnsafeMutableBytes { BIO_read(outgoing, $0.baseAddress! + start, Int32(pending)) }
        output.removeLast(pending - max(0, Int(n)))
    }
}
