import CCrypto

/// Message encryption for Web Push (RFC 8291): aes128gcm content coding
/// (RFC 8188) in one record, keyed by ECDH between a fresh key pair and the
/// subscription's p256dh key, and by the subscription's auth secret.
public enum WebPushEncryption {
    /// What encryption adds to the plaintext: the header (86), the
    /// last-record delimiter (1) and the GCM tag (16).
    public static let overhead = 103
    /// Push services accept bodies of at most 4096 bytes (RFC 8030 7.2).
    public static let maxBody = 4096
    public static let maxPlaintext = maxBody - overhead
    static let recordSize: UInt32 = 4096
    static let saltBytes = 16
    static let authBytes = 16

    /// `p256dh` is the subscription's 65-byte uncompressed P-256 point, `auth`
    /// its 16-byte secret. Each call uses a new key pair and salt, as RFC 8291
    /// requires.
    public static func encrypt(plaintext: [UInt8], p256dh: [UInt8], auth: [UInt8]) throws(PushCryptoError) -> [UInt8] {
        var salt = [UInt8](repeating: 0, count: saltBytes)
        guard RAND_bytes(&salt, Int32(saltBytes)) == 1 else { throw PushCryptoError("libcrypto has no random bytes") }
        return try encrypt(plaintext: plaintext, p256dh: p256dh, auth: auth, serverKey: P256.generate(), salt: salt)
    }

    /// With the application server's key pair and the salt given: RFC 8291
    /// Appendix A's example, and nothing else, uses this.
    static func encrypt(plaintext: [UInt8], p256dh: [UInt8], auth: [UInt8],
                        serverKey: EVPKey, salt: [UInt8]) throws(PushCryptoError) -> [UInt8] {
        guard plaintext.count <= maxPlaintext else {
            throw PushCryptoError("a Web Push message holds at most \(maxPlaintext) bytes, not \(plaintext.count)")
        }
        guard auth.count == authBytes else { throw PushCryptoError("a Web Push auth secret is 16 bytes") }
        precondition(salt.count == saltBytes)
        let userAgentKey = try P256.publicKey(point: p256dh)
        let serverPoint = try P256.point(of: serverKey)
        let ecdhSecret = try P256.sharedSecret(serverKey, userAgentKey)

        // RFC 8291 section 3.4: the auth secret and both public keys bind the input key.
        let prkKey = HKDF.extract(salt: auth, ikm: ecdhSecret)
        let ikm = HKDF.expand(prk: prkKey, info: Array("WebPush: info\0".utf8) + p256dh + serverPoint, length: 32)
        // RFC 8188 section 2.2 and 2.3.
        let prk = HKDF.extract(salt: salt, ikm: ikm)
        let cek = HKDF.expand(prk: prk, info: Array("Content-Encoding: aes128gcm\0".utf8), length: 16)
        let nonce = HKDF.expand(prk: prk, info: Array("Content-Encoding: nonce\0".utf8), length: 12)

        // Header: salt, record size, key id length, key id (the server's public point).
        var body = salt
        body += withUnsafeBytes(of: recordSize.bigEndian) { Array($0) }
        body.append(UInt8(serverPoint.count))
        body += serverPoint
        // The only record is the last: its delimiter is 2, and it needs no padding.
        body += try seal(plaintext + [2], key: cek, nonce: nonce)
        return body
    }

    /// AES-128-GCM without associated data: ciphertext || 16-byte tag.
    static func seal(_ plaintext: [UInt8], key: [UInt8], nonce: [UInt8]) throws(PushCryptoError) -> [UInt8] {
        guard let ctx = EVP_CIPHER_CTX_new() else { throw PushCryptoError("libcrypto could not allocate a cipher context") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        let tagBytes = 16
        var out = [UInt8](repeating: 0, count: plaintext.count + tagBytes)
        let sealed = out.withUnsafeMutableBufferPointer { buf -> Bool in
            var length: Int32 = 0, final: Int32 = 0
            guard EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nil, key, nonce) == 1,
                  EVP_EncryptUpdate(ctx, buf.baseAddress, &length, plaintext, Int32(plaintext.count)) == 1,
                  EVP_EncryptFinal_ex(ctx, buf.baseAddress! + Int(length), &final) == 1,
                  Int(length + final) == plaintext.count else { return false }
            return EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, Int32(tagBytes), buf.baseAddress! + plaintext.count) == 1
        }
        guard sealed else { throw PushCryptoError("AES-128-GCM encryption failed") }
        return out
    }
}
