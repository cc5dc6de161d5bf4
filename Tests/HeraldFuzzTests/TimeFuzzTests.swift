import XCTest
import HeraldTestSupport
#if canImport(Glibc)
import Glibc
#else
import Darwin
#endif
import HeraldCore

/// `RFC3339.parse` against a reference built on the C library's timegm.
final class TimeFuzzTests: XCTestCase {

    /// 0000-01-01T00:00:00.000Z ... 9999-12-31T23:59:59.999Z: what the wire's
    /// 4-digit years can express.
    static let formattableRange: ClosedRange<Millis> = -62_167_219_200_000...253_402_300_799_999
    static func formattable(_ ms: Millis) -> Bool { formattableRange.contains(ms) }

    static let target = FuzzTarget(
        name: "time",
        dictionary: ["-", ":", "T", "t", "Z", "z", "+", ".", "00", "29", "30", "31", "60", "24", "02", "13", "0000", "9999",
                     "1900", "2000", "2100", "+00:00", "-23:59", "+24:00", ".000", ".9999999"],
        maxLength: 512,
        generate: { rng in Array(generateTime(&rng).utf8) },
        check: { bytes in
            let s = String(decoding: bytes, as: UTF8.self)
            let expected = reference(Array(s.utf8))
            let got = RFC3339.parse(s)
            guard got == expected else {
                return .failed("\(s.debugDescription): parse gives \(got.map(String.init) ?? "nil"), timegm reference \(expected.map(String.init) ?? "nil")")
            }
            guard let ms = got else { return .rejected }
            if formattable(ms) {
                let f = RFC3339.format(ms)
                guard f.utf8.count == 24, f.hasSuffix("Z") else { return .failed("format(\(ms)) = \(f)") }
                guard RFC3339.parse(f) == ms else { return .failed("format(\(ms)) = \(f) does not parse back") }
            }
            return .accepted
        })

    func testFuzzRFC3339() { FuzzRunner.run(Self.target, test: self) }

    /// `RFC3339.format` on any Int64 milliseconds (it formats token expiries
    /// and computed times): never traps, and round-trips where 4-digit
    /// years can express the time. Input: decimal text, else up to 8 bytes
    /// little-endian.
    static let format = FuzzTarget(
        name: "format",
        dictionary: ["-", "0", "9", "000", "922337203685477", "-922337203685477"],
        maxLength: 64,
        generate: { rng in
            let edges: [Int64] = [0, -1, 1, Int64.max, Int64.min, Int64.max / 1000, Int64.min / 1000, Int64.min + 807, Int64.min + 808,
                                  formattableRange.lowerBound - 1, formattableRange.upperBound + 1]
            let ms = rng.oneIn(4) ? rng.pick(edges) : Int64(bitPattern: rng.next()) >> rng.below(64)
            return Array(String(ms).utf8)
        },
        check: { bytes in
            let text = String(decoding: bytes, as: UTF8.self)
            let ms = Int64(text) ?? bytes.prefix(8).enumerated().reduce(Int64(0)) { $0 | Int64($1.element) << (8 * $1.offset) }
            let f = RFC3339.format(ms)
            guard formattable(ms) else { return .rejected }
            guard f.utf8.count == 24, RFC3339.parse(f) == ms else { return .failed("format(\(ms)) = \(f) does not parse back") }
            return .accepted
        })

    func testFuzzRFC3339Format() { FuzzRunner.run(Self.format, test: self) }

    static func reference(_ b: [UInt8]) -> Millis? {
        func digits(_ r: Range<Int>) -> Int? {
            guard r.upperBound <= b.count else { return nil }
            var v = 0
            for k in r { guard b[k] >= 0x30, b[k] <= 0x39 else { return nil }; v = v * 10 + Int(b[k] - 0x30) }
            return v
        }
        func at(_ i: Int, _ c: String) -> Bool { i < b.count && c.utf8.contains(b[i]) }
        guard let y = digits(0..<4), at(4, "-"), let mo = digits(5..<7), at(7, "-"), let d = digits(8..<10), at(10, "Tt"),
              let h = digits(11..<13), at(13, ":"), let mi = digits(14..<16), at(16, ":"), let se = digits(17..<19) else { return nil }
        var i = 19
        var milli = 0
        if at(i, ".") {
            i += 1
            let start = i
            while i < b.count, b[i] >= 0x30, b[i] <= 0x39 { i += 1 }
            guard i > start else { return nil }
            let frac = Array(b[start..<min(i, start + 3)]) + Array(repeating: 0x30, count: max(0, 3 - (i - start)))
            milli = Int(String(decoding: frac, as: UTF8.self))!
        }
        var offset = 0
        if at(i, "Zz") { i += 1 } else if at(i, "+-") {
            guard let oh = digits(i + 1..<i + 3), at(i + 3, ":"), let om = digits(i + 4..<i + 6), oh < 24, om < 60 else { return nil }
            offset = (oh * 60 + om) * 60 * (b[i] == UInt8(ascii: "+") ? 1 : -1)
            i += 6
        } else { return nil }
        guard i == b.count, (1...12).contains(mo), (1...31).contains(d), h < 24, mi < 60, se < 60 else { return nil }
        var t = tm()
        t.tm_year = Int32(y - 1900); t.tm_mon = Int32(mo - 1); t.tm_mday = Int32(d)
        t.tm_hour = Int32(h); t.tm_min = Int32(mi); t.tm_sec = Int32(se)
        let secs = timegm(&t)
        // timegm normalises impossible dates (Feb 30 → Mar 2): refuse those.
        guard t.tm_mday == Int32(d), t.tm_mon == Int32(mo - 1) else { return nil }
        return (Int64(secs) - Int64(offset)) * 1000 + Int64(milli)
    }

    static func generateTime(_ rng: inout SplitMix64) -> String {
        func pad(_ v: Int, _ w: Int) -> String { let s = String(v); return String(repeating: "0", count: max(0, w - s.count)) + s }
        let year = rng.oneIn(3) ? rng.pick([0, 1, 1900, 1970, 2000, 2024, 2026, 2100, 2400, 9999]) : rng.range(0, 9999)
        let month = rng.oneIn(10) ? rng.pick([0, 13, 99]) : rng.range(1, 12)
        let day = rng.oneIn(3) ? rng.pick([0, 28, 29, 30, 31, 32]) : rng.range(1, 28)
        let hour = rng.oneIn(10) ? rng.pick([24, 25, 99]) : rng.range(0, 23)
        let minute = rng.oneIn(10) ? 60 : rng.range(0, 59)
        let second = rng.oneIn(10) ? rng.pick([60, 61]) : rng.range(0, 59)
        var s = "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))\(rng.oneIn(8) ? "t" : "T")\(pad(hour, 2)):\(pad(minute, 2)):\(pad(second, 2))"
        if !rng.oneIn(3) {
            s += "." + String((0..<rng.range(0, 10)).map { _ in Character(String(rng.range(0, 9))) })
        }
        switch rng.below(4) {
        case 0: s += "Z"
        case 1: s += "z"
        default:
            s += (rng.oneIn(2) ? "+" : "-") + pad(rng.oneIn(8) ? 24 : rng.range(0, 23), 2) + ":" + pad(rng.oneIn(8) ? 60 : rng.range(0, 59), 2)
        }
        return s
    }
}
