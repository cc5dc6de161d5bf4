import CCrypto

/// Owns one libcrypto EVP_PKEY. Sendable because nothing changes a key once
/// built, and libcrypto 3 lets many threads use one key at a time.
final class EVPKey: @unchecked Sendable {  // the key never changes once built, and libcrypto 3 lets threads share it
    let pointer: OpaquePointer

    init(_ pointer: OpaquePointer) { self.pointer = pointer }
    deinit { EVP_PKEY_free(pointer) }

    /// The first private key in `pem` that needs no passphrase: PKCS#8
    /// ("PRIVATE KEY"), SEC1 ("EC PRIVATE KEY") or PKCS#1 ("RSA PRIVATE KEY").
    static func privateKey(pem: String) throws(PushCryptoError) -> EVPKey {
        let text = Array(pem.utf8)
        guard text.count <= 1 << 20 else { throw PushCryptoError("the PEM text is larger than 1 MiB") }
        let pkey: OpaquePointer? = text.withUnsafeBytes { buf in
            guard let bio = BIO_new_mem_buf(buf.baseAddress, Int32(buf.count)) else { return nil }
            defer { BIO_free(bio) }
            // A callback that gives no passphrase: the default one would prompt on the terminal.
            return PEM_read_bio_PrivateKey(bio, nil, { _, _, _, _ in 0 }, nil)
        }
        guard let pkey else { throw PushCryptoError("no unencrypted private key in the PEM text") }
        return EVPKey(pkey)
    }

    func isA(_ type: String) -> Bool { EVP_PKEY_is_a(pointer, type) == 1 }

    /// SHA-256 and the key's own scheme: ECDSA (DER signature) or RSASSA-PKCS1-v1_5.
    /// The key was checked when loaded, so libcrypto fails here only when it
    /// cannot allocate, which Swift treats as fatal anyway.
    func signSHA256(_ message: [UInt8]) -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { preconditionFailure("libcrypto could not allocate a digest context") }
        defer { EVP_MD_CTX_free(ctx) }
        var length = 0
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, pointer) == 1,
              EVP_DigestSign(ctx, nil, &length, message, message.count) == 1 else {
            preconditionFailure("libcrypto could not start a signature")
        }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(ctx, &signature, &length, message, message.count) == 1 else {
            preconditionFailure("libcrypto could not sign")
        }
        return Array(signature.prefix(length))
    }
}
