import HeraldCore
import HeraldCrypto

/// HKDF with SHA-256 (RFC 5869), on HeraldCrypto's HMAC.
enum HKDF {
    static func extract(salt: [UInt8], ikm: [UInt8]) -> [UInt8] {
        HMACSHA256.mac(key: salt, message: ikm)
    }

    static func expand(prk: [UInt8], info: [UInt8], length: Int) -> [UInt8] {
        precondition((1...255 * 32).contains(length), "HKDF-SHA256 yields 1 to 8160 bytes")
        var okm: [UInt8] = []
        var block: [UInt8] = []
        for counter in 1...(length + 31) / 32 {
            block = HMACSHA256.mac(key: prk, message: block + info + [UInt8(counter)])
            okm += block
        }
        return Array(okm.prefix(length))
    }
}
