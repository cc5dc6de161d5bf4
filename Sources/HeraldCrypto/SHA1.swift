import CCrypto

/// SHA-1 through OpenSSL's libcrypto: the WebSocket handshake (RFC 6455
/// section 4.2.2) needs it, nothing else does.
public enum SHA1 {
    public static func digest(_ bytes: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 20)
        var len: UInt32 = 20
        _ = bytes.withUnsafeBufferPointer { b in
            out.withUnsafeMutableBufferPointer { o in EVP_Digest(b.baseAddress, b.count, o.baseAddress, &len, EVP_sha1(), nil) }
        }
        return out
    }
}
