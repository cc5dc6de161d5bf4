#if canImport(Glibc)
import Glibc
#else
import Darwin
#endif

/// Milliseconds since the Unix epoch: the one time type of the domain.
public typealias Millis = Int64

public enum WallClock {
    public static func now() -> Millis {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Millis(ts.tv_sec) * 1000 + Millis(ts.tv_nsec / 1_000_000)
    }
}

/// RFC 3339 UTC with milliseconds and `Z`, as every time on the wire.
public enum RFC3339 {
    public static func format(_ ms: Millis) -> String {
        let s = String(unsafeUninitializedCapacity: 24) { write(ms, to: $0) }
        return s.isEmpty ? formatWide(ms) : s
    }

    /// Appends `format(ms)` to `out` without making a String.
    public static func append(_ ms: Millis, to out: inout [UInt8]) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 24) { b in
            let n = write(ms, to: b)
            if n == 0 { out.append(contentsOf: formatWide(ms).utf8) } else { out.append(contentsOf: UnsafeBufferPointer(rebasing: b[..<n])) }
        }
    }

    /// Every time on the wire goes through here (three per notification
    /// encoded), so years 0000–9999 are written digit by digit into the 24
    /// bytes of `b`; 0 (nothing written) for other years.
    private static func write(_ ms: Millis, to b: UnsafeMutableBufferPointer<UInt8>) -> Int {
        let days = Int(ms.floorDiv(86_400_000))
        let (y, m, d) = civilFromDays(days)
        guard (0...9999).contains(y) else { return 0 }
        let inDay = Int(ms - Int64(days) * 86_400_000)
        var i = 0
        func put(_ value: Int, _ width: Int, _ separator: UInt8) {
            var v = value
            for p in stride(from: i + width - 1, through: i, by: -1) {
                b[p] = UInt8(0x30 + v % 10)
                v /= 10
            }
            b[i + width] = separator
            i += width + 1
        }
        put(y, 4, UInt8(ascii: "-")); put(m, 2, UInt8(ascii: "-")); put(d, 2, UInt8(ascii: "T"))
        put(inDay / 3_600_000, 2, UInt8(ascii: ":")); put(inDay / 60_000 % 60, 2, UInt8(ascii: ":"))
        put(inDay / 1000 % 60, 2, UInt8(ascii: ".")); put(inDay % 1000, 3, UInt8(ascii: "Z"))
        return i
    }

    private static func formatWide(_ ms: Millis) -> String {
        var secs = time_t(ms.floorDiv(1000))
        // Computed apart from `secs * 1000`, which overflows near Int64.min.
        let milli = Int(((ms % 1000) + 1000) % 1000)
        var t = tm()
        gmtime_r(&secs, &t)
        func pad(_ v: Int32, _ w: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, w - s.count)) + s
        }
        return "\(pad(t.tm_year + 1900, 4))-\(pad(t.tm_mon + 1, 2))-\(pad(t.tm_mday, 2))T"
            + "\(pad(t.tm_hour, 2)):\(pad(t.tm_min, 2)):\(pad(t.tm_sec, 2)).\(pad(Int32(milli), 3))Z"
    }

    /// Parses `YYYY-MM-DDTHH:MM:SS[.fff]` followed by `Z` or `±HH:MM`.
    public static func parse(_ s: String) -> Millis? {
        let b = Array(s.utf8)
        func num(_ from: Int, _ len: Int) -> Int? {
            guard from + len <= b.count else { return nil }
            var v = 0
            for k in from..<from + len {
                guard b[k] >= 0x30, b[k] <= 0x39 else { return nil }
                v = v * 10 + Int(b[k] - 0x30)
            }
            return v
        }
        guard b.count >= 20, let year = num(0, 4), b[4] == 0x2D, let month = num(5, 2), b[7] == 0x2D,
              let day = num(8, 2), b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t"),
              let hour = num(11, 2), b[13] == 0x3A, let minute = num(14, 2), b[16] == 0x3A,
              let second = num(17, 2)
        else { return nil }
        guard (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 60 else { return nil }
        var i = 19
        var milli = 0
        if i < b.count, b[i] == 0x2E {
            i += 1
            var digits = 0
            while i < b.count, b[i] >= 0x30, b[i] <= 0x39 {
                if digits < 3 { milli = milli * 10 + Int(b[i] - 0x30) }
                digits += 1; i += 1
            }
            guard digits > 0 else { return nil }
            for _ in digits..<max(digits, 3) { milli *= 10 }
        }
        var offset = 0
        guard i < b.count else { return nil }
        if b[i] == UInt8(ascii: "Z") || b[i] == UInt8(ascii: "z") {
            i += 1
        } else if b[i] == 0x2B || b[i] == 0x2D {
            guard let oh = num(i + 1, 2), b.count > i + 3, b[i + 3] == 0x3A, let om = num(i + 4, 2),
                  oh < 24, om < 60 else { return nil }
            offset = (oh * 60 + om) * 60 * (b[i] == 0x2B ? 1 : -1)
            i += 6
        } else { return nil }
        guard i == b.count else { return nil }
        let days = daysFromCivil(year, month, day)
        // Reject impossible dates such as Feb 30 by round-tripping the day.
        guard daysFromCivil(year, month, 1) + day - 1 == days, day <= daysInMonth(year, month) else { return nil }
        let secs = Int64(days) * 86400 + Int64(hour * 3600 + minute * 60 + second) - Int64(offset)
        return secs * 1000 + Int64(milli)
    }

    static func daysInMonth(_ y: Int, _ m: Int) -> Int {
        switch m {
        case 2: return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Days since 1970-01-01 (Howard Hinnant's algorithm).
    /// The inverse of `daysFromCivil` (H. Hinnant's algorithm): (year, month, day).
    static func civilFromDays(_ z0: Int) -> (Int, Int, Int) {
        let z = z0 + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), m, d)
    }

    static func daysFromCivil(_ y0: Int, _ m: Int, _ d: Int) -> Int {
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }
}

extension Int64 {
    public func floorDiv(_ d: Int64) -> Int64 {
        let q = self / d
        return (self % d != 0 && (self < 0) != (d < 0)) ? q - 1 : q
    }
}
