public enum Base64URL {
    static let table: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    public static func encode(_ bytes: [UInt8]) -> String { String(decoding: encode(bytes, table: table, padded: false), as: UTF8.self) }

    /// The digits of `bytes` in `table`'s alphabet, `=`-padded to a
    /// multiple of four when `padded`.
    static func encode(_ bytes: [UInt8], table: [UInt8], padded: Bool) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        func digit(_ v: UInt32, _ shift: UInt32) { out.append(table[Int(v >> shift & 63)]) }
        var i = 0
        while i + 3 <= bytes.count {
            let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])
            digit(v, 18); digit(v, 12); digit(v, 6); digit(v, 0)
            i += 3
        }
        let rest = bytes.count - i
        if rest == 1 {
            let v = UInt32(bytes[i]) << 16
            digit(v, 18); digit(v, 12)
            if padded { out += [UInt8(ascii: "="), UInt8(ascii: "=")] }
        } else if rest == 2 {
            let v = UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8
            digit(v, 18); digit(v, 12); digit(v, 6)
            if padded { out.append(UInt8(ascii: "=")) }
        }
        return out
    }

    /// As `decode`, also taking the `=` padding that completes the last
    /// group of four (some browsers and libraries send it, others not).
    public static func decode(optionallyPadded s: Substring) -> [UInt8]? {
        let unpadded = s.prefix { $0 != "=" }
        let padding = s.count - unpadded.count
        guard padding == 0 || (padding <= 2 && s.count % 4 == 0 && s.dropFirst(unpadded.count).allSatisfy({ $0 == "=" })) else {
            return nil
        }
        return decode(unpadded)
    }

    /// Strict: unpadded alphabet only, and no stray bits in the last digit.
    public static func decode(_ s: Substring) -> [UInt8]? {
        var out: [UInt8] = []
        var acc: UInt32 = 0
        var bits = 0
        for c in s.utf8 {
            let d: UInt32
            switch c {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): d = UInt32(c - 65)
            case UInt8(ascii: "a")...UInt8(ascii: "z"): d = UInt32(c - 97 + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - 48 + 52)
            case UInt8(ascii: "-"): d = 62
            case UInt8(ascii: "_"): d = 63
            default: return nil
            }
            acc = (acc << 6) | d
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8((acc >> UInt32(bits)) & 0xFF))
            }
        }
        if bits >= 6 || (acc & ((1 << UInt32(bits)) - 1)) != 0 { return nil }
        return out
    }
}

/// Standard base64 (RFC 4648 section 4), padded: what Standard Webhooks
/// secrets and signatures are written in.
public enum Base64 {
    static let table: [UInt8] = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    public static func encode(_ bytes: [UInt8]) -> String {
        String(decoding: Base64URL.encode(bytes, table: table, padded: true), as: UTF8.self)
    }

    /// Strict: padded to a multiple of four, no stray bits.
    public static func decode(_ s: Substring) -> [UInt8]? {
        guard s.count % 4 == 0, !s.contains("-"), !s.contains("_") else { return nil }
        return Base64URL.decode(optionallyPadded: Substring(s.map { $0 == "+" ? "-" : $0 == "/" ? "_" : $0 }))
    }
}
