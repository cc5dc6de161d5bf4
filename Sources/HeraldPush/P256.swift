import CCrypto

/// P-256 keys from raw bytes, generated, and agreed on (ECDH): what ES256 and
/// Web Push encryption share. Raw keys are wrapped in fixed DER prefixes and
/// parsed by libcrypto, which checks that a point lies on the curve.
enum P256 {
    static let scalarBytes = 32
    /// Uncompressed point: 0x04 || x || y.
    static let pointBytes = 65

    /// The group order n: a private scalar must lie in [1, n-1].
    static let order: [UInt8] = [
        0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
        0xBC, 0xE6, 0xFA, 0xAD, 0xA7, 0x17, 0x9E, 0x84, 0xF3, 0xB9, 0xCA, 0xC2, 0xFC, 0x63, 0x25, 0x51,
    ]
    /// SEC1 ECPrivateKey { version 1, privateKey OCTET STRING (32) ... } up to the scalar,
    static let sec1Prefix: [UInt8] = [0x30, 0x31, 0x02, 0x01, 0x01, 0x04, 0x20]
    /// ... then [0] the prime256v1 OID. libcrypto computes the public key.
    static let sec1Suffix: [UInt8] = [0xA0, 0x0A, 0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07]
    /// SubjectPublicKeyInfo { id-ecPublicKey, prime256v1 } BIT STRING, up to the point.
    static let spkiPrefix: [UInt8] = [
        0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01,
        0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
    ]

    static func privateKey(scalar: [UInt8]) throws(PushCryptoError) -> EVPKey {
        guard scalar.count == scalarBytes else { throw PushCryptoError("a P-256 private key is 32 bytes") }
        // Big-endian arrays of equal length compare as their numbers do.
        guard scalar.contains(where: { $0 != 0 }), scalar.lexicographicallyPrecedes(order) else {
            throw PushCryptoError("the P-256 private key is out of range")
        }
        let der = sec1Prefix + scalar + sec1Suffix
        guard let pkey = der.withUnsafeBufferPointer({ buf -> OpaquePointer? in
            var p = buf.baseAddress
            return d2i_PrivateKey(EVP_PKEY_EC, nil, &p, buf.count)
        }) else { throw PushCryptoError("libcrypto refused the P-256 private key") }
        return EVPKey(pkey)
    }

    /// An uncompressed point, refused unless it lies on the curve.
    static func publicKey(point: [UInt8]) throws(PushCryptoError) -> EVPKey {
        guard point.count == pointBytes, point[0] == 0x04 else {
            throw PushCryptoError("a P-256 public key is a 65-byte uncompressed point")
        }
        let der = spkiPrefix + point
        guard let pkey = der.withUnsafeBufferPointer({ buf -> OpaquePointer? in
            var p = buf.baseAddress
            return d2i_PUBKEY(nil, &p, buf.count)
        }) else { throw PushCryptoError("the P-256 public key is not a point on the curve") }
        return EVPKey(pkey)
    }

    static func generate() throws(PushCryptoError) -> EVPKey {
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else { throw PushCryptoError("libcrypto has no EC keys") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var pkey: OpaquePointer?
        guard EVP_PKEY_keygen_init(ctx) == 1, EVP_PKEY_CTX_set_group_name(ctx, "P-256") == 1,
              EVP_PKEY_generate(ctx, &pkey) == 1, let pkey else {
            throw PushCryptoError("libcrypto could not generate a P-256 key")
        }
        return EVPKey(pkey)
    }

    /// True for an EC key on P-256 (libcrypto names it prime256v1).
    static func holds(_ key: EVPKey) -> Bool {
        guard key.isA("EC") else { return false }
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        guard EVP_PKEY_get_group_name(key.pointer, &name, name.count, &length) == 1 else { return false }
        return String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self) == "prime256v1"
    }

    /// The public key as an uncompressed point, whatever form it was stored in.
    static func point(of key: EVPKey) throws(PushCryptoError) -> [UInt8] {
        var point: [UInt8] = [0x04]
        for name in [OSSL_PKEY_PARAM_EC_PUB_X, OSSL_PKEY_PARAM_EC_PUB_Y] {
            var bn: OpaquePointer?
            guard EVP_PKEY_get_bn_param(key.pointer, name, &bn) == 1, let bn else {
                throw PushCryptoError("the P-256 key has no public point")
            }
            defer { BN_free(bn) }
            var coordinate = [UInt8](repeating: 0, count: scalarBytes)
            guard BN_bn2binpad(bn, &coordinate, Int32(scalarBytes)) == Int32(scalarBytes) else {
                throw PushCryptoError("the P-256 public point is malformed")
            }
            point += coordinate
        }
        return point
    }

    /// ECDH: the x coordinate of own × peer (32 bytes).
    static func sharedSecret(_ own: EVPKey, _ peer: EVPKey) throws(PushCryptoError) -> [UInt8] {
        guard let ctx = EVP_PKEY_CTX_new_from_pkey(nil, own.pointer, nil) else {
            throw PushCryptoError("libcrypto could not allocate a key context")
        }
        defer { EVP_PKEY_CTX_free(ctx) }
        var secret = [UInt8](repeating: 0, count: scalarBytes)
        var length = secret.count
        guard EVP_PKEY_derive_init(ctx) == 1, EVP_PKEY_derive_set_peer(ctx, peer.pointer) == 1,
              EVP_PKEY_derive(ctx, &secret, &length) == 1, length == scalarBytes else {
            throw PushCryptoError("ECDH with the P-256 public key failed")
        }
        return secret
    }
}
