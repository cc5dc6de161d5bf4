import CCrypto
import HeraldCore

/// A P-256 private key that signs ES256 (ECDSA with SHA-256): APNs provider
/// tokens and VAPID.
public struct ES256Key: Sendable {
    let key: EVPKey
    /// The public key as an uncompressed point, 0x04 || x || y (65 bytes).
    public let publicKeyRaw: [UInt8]

    /// PKCS#8 ("PRIVATE KEY": Apple's .p8 files, py-vapid's private_key.pem)
    /// or SEC1 ("EC PRIVATE KEY") PEM.
    public init(pem: String) throws(PushCryptoError) {
        let key = try EVPKey.privateKey(pem: pem)
        guard P256.holds(key) else { throw PushCryptoError("the key is not a P-256 (prime256v1) EC key") }
        try self.init(key)
    }

    /// The 32-byte private scalar as unpadded base64url (the web-push
    /// libraries' VAPID key). Surrounding whitespace, such as a file's final
    /// newline, is ignored.
    public init(base64URLPrivateKey text: String) throws(PushCryptoError) {
        let words = text.split(whereSeparator: \.isWhitespace)
        guard words.count == 1, let scalar = Base64URL.decode(words[0]) else {
            throw PushCryptoError("the private key is not unpadded base64url")
        }
        try self.init(P256.privateKey(scalar: scalar))
    }

    /// A key file's text in either form above, told apart by the PEM armour.
    public init(pemOrRaw text: String) throws(PushCryptoError) {
        if text.contains("-----BEGIN") { try self.init(pem: text) } else { try self.init(base64URLPrivateKey: text) }
    }

    init(_ key: EVPKey) throws(PushCryptoError) {
        self.key = key
        publicKeyRaw = try P256.point(of: key)
    }

    /// The JOSE form of the signature: r || s, 32 bytes each.
    public func sign(_ message: [UInt8]) -> [UInt8] {
        guard let signature = Self.joseSignature(der: key.signSHA256(message)) else {
            preconditionFailure("libcrypto returned a malformed ECDSA signature")
        }
        return signature
    }

    /// libcrypto gives ECDSA-Sig-Value { r INTEGER, s INTEGER } in DER, whose
    /// integers drop leading zero bytes (or add one before a high bit); JOSE
    /// wants both as fixed 32-byte big-endian numbers.
    static func joseSignature(der: [UInt8]) -> [UInt8]? {
        guard let sig = der.withUnsafeBufferPointer({ buf -> OpaquePointer? in
            var p = buf.baseAddress
            return d2i_ECDSA_SIG(nil, &p, buf.count)
        }) else { return nil }
        defer { ECDSA_SIG_free(sig) }
        var r: OpaquePointer?, s: OpaquePointer?
        ECDSA_SIG_get0(sig, &r, &s)
        var out = [UInt8](repeating: 0, count: 2 * P256.scalarBytes)
        let width = Int32(P256.scalarBytes)
        let written = out.withUnsafeMutableBufferPointer { buf in
            (BN_bn2binpad(r, buf.baseAddress, width), BN_bn2binpad(s, buf.baseAddress! + P256.scalarBytes, width))
        }
        guard written == (width, width) else { return nil }
        return out
    }
}
