import CCrypto

/// An RSA private key that signs RS256 (RSASSA-PKCS1-v1_5 with SHA-256): the
/// JWT-bearer grant that buys FCM access tokens.
public struct RS256Key: Sendable {
    let key: EVPKey

    /// PKCS#8 ("PRIVATE KEY", as in a Google service-account file) or PKCS#1
    /// ("RSA PRIVATE KEY") PEM, of at least 2048 bits.
    public init(pem: String) throws(PushCryptoError) {
        let key = try EVPKey.privateKey(pem: pem)
        guard key.isA("RSA") else { throw PushCryptoError("the key is not an RSA key") }
        guard EVP_PKEY_get_bits(key.pointer) >= 2048 else { throw PushCryptoError("RSA keys under 2048 bits are refused") }
        self.key = key
    }

    public func sign(_ message: [UInt8]) -> [UInt8] { key.signSHA256(message) }
}
