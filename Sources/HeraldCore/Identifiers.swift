import Synchronization

/// Character rules for the ids of SPEC section 1 and tags of section 8.
public enum Identifiers {
    static func matches(_ s: String, min: Int, max: Int, extra: StaticString) -> Bool {
        let n = s.utf8.count
        guard n >= min, n <= max else { return false }
        let allowed = UnsafeBufferPointer(start: extra.utf8Start, count: extra.utf8CodeUnitCount)
        for c in s.utf8 {
            switch c {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"): continue
            default: if !allowed.contains(c) { return false }
            }
        }
        return true
    }

    public static func isAppId(_ s: String) -> Bool { matches(s, min: 1, max: 64, extra: "._-") }
    /// Token secrets' `kid`s follow the app-id rule.
    public static func isKeyId(_ s: String) -> Bool { isAppId(s) }
    /// User ids, device ids and appNotificationIds share one rule.
    public static func isUserId(_ s: String) -> Bool { matches(s, min: 1, max: 128, extra: "._@:-") }
    public static func isTag(_ s: String) -> Bool { matches(s, min: 1, max: 160, extra: "_@#.:-") }
}

/// Server-generated notification ids: `n_` + 26 Crockford base32 characters
/// of a ULID (48-bit milliseconds, 80 random bits): unique, and ordered by
/// creation: within one millisecond the random part is incremented (the ULID
/// "monotonic" rule), so history's tie-break on the higher id (SPEC 4) is
/// also newest first.
///
/// A notification's id is made with its `createdAt` (`make(now:)`, the same
/// `now`) and neither changes after, and the digits are in byte order, so
/// ids in byte order are history order, `createdAt` then id: stores read
/// history by id (`NotificationStore.history`).
public enum NotificationID {
    static let alphabet: [UInt8] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

    struct Last { var ms: Millis = -1; var random = [UInt8](repeating: 0, count: 10) }
    static let last = Mutex(Last())

    /// Whether `s` has the form of every id `make` gives. Anything else
    /// names no notification; PostgreSQL could not even be asked about an id
    /// with a NUL in it (its text holds none: the statement fails, and with
    /// it every write of its batch).
    public static func isWellFormed(_ s: String) -> Bool {
        let u = s.utf8
        return u.count == 28 && u.starts(with: "n_".utf8) && u.dropFirst(2).allSatisfy(alphabet.contains)
    }

    public static func make(now: Millis = WallClock.now()) -> String {
        let (ms, rnd) = last.withLock { l -> (Millis, [UInt8]) in
            if now == l.ms {
                // Same millisecond: count up, so ids created within it sort in
                // creation order (createdAt ties are broken by the id).
                var i = 9
                while i >= 0 {
                    l.random[i] &+= 1
                    if l.random[i] != 0 { break }
                    i -= 1
                }
            } else {
                l.ms = now
                Random.fill(&l.random)
                l.random[0] &= 0x7F   // room to count up without wrapping
            }
            return (l.ms, l.random)
        }
        return encode(ms: ms, random: rnd)
    }

    /// Above every id made in millisecond `ms` or before, and no id made
    /// after is below it: the first id of the next millisecond.
    public static func above(millisecond ms: Millis) -> String {
        // The first digit carries 3 bits: every id's is at most "7".
        ms >= (1 << 48) - 1 ? "n_8" : encode(ms: ms + 1, random: [UInt8](repeating: 0, count: 10))
    }

    private static func encode(ms: Millis, random rnd: [UInt8]) -> String {
        var bytes = [UInt8](repeating: 0, count: 16)
        var t = UInt64(max(0, ms))
        for k in stride(from: 5, through: 0, by: -1) { bytes[k] = UInt8(t & 0xFF); t >>= 8 }
        for k in 0..<10 { bytes[6 + k] = rnd[k] }
        // 128 bits → 26 base32 digits (the first carries 3 bits).
        var out: [UInt8] = Array("n_".utf8)
        var acc: UInt32 = 0
        var bits = 2 // pad to 130 bits so every digit is 5 bits
        for b in bytes {
            acc = (acc << 8) | UInt32(b)
            bits += 8
            while bits >= 5 {
                bits -= 5
                out.append(alphabet[Int((acc >> UInt32(bits)) & 31)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

public enum Random {
    /// From the operating system's secure source (getrandom on Linux,
    /// arc4random on Apple platforms), through the standard library so that
    /// the domain needs no C library.
    public static func fill(_ bytes: inout [UInt8]) {
        var source = SystemRandomNumberGenerator()
        var word: UInt64 = 0
        for i in bytes.indices {
            if i % 8 == 0 { word = source.next() }
            bytes[i] = UInt8(truncatingIfNeeded: word)
            word >>= 8
        }
    }

    /// `count` random bytes as lowercase hex.
    public static func hex(_ count: Int) -> String {
        var b = [UInt8](repeating: 0, count: count)
        fill(&b)
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: b.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 15)]] }, as: UTF8.self)
    }
}
