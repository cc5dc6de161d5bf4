import CCrypto

/// P-256 checks the domain needs (a Web Push subscription's key).
public enum EllipticCurve {
    /// Whether `bytes` is an uncompressed point on P-256 (not merely 65 bytes):
    /// a registration that could never be encrypted to is refused at once.
    public static func isP256Point(_ bytes: [UInt8]) -> Bool {
        guard bytes.count == 65, bytes[0] == 0x04,
              let group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1) else { return false }
        defer { EC_GROUP_free(group) }
        guard let point = EC_POINT_new(group) else { return false }
        defer { EC_POINT_free(point) }
        return bytes.withUnsafeBufferPointer { b in
            EC_POINT_oct2point(group, point, b.baseAddress, b.count, nil) == 1
                && EC_POINT_is_on_curve(group, point, nil) == 1
        }
    }
}
