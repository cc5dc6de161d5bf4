import XCTest
import Foundation
@testable import HeraldCore

final class RFC3339Tests: XCTestCase {

    func testFormatShape() {
        XCTAssertEqual(RFC3339.format(T0), "2026-11-22T10:00:00.000Z")
        XCTAssertEqual(RFC3339.format(0), "1970-01-01T00:00:00.000Z")
        XCTAssertEqual(RFC3339.format(T0 + 5), "2026-11-22T10:00:00.005Z")
        XCTAssertEqual(RFC3339.format(T0 + 61_042), "2026-11-22T10:01:01.042Z")
        XCTAssertEqual(RFC3339.format(951_782_400_000 + 999), "2000-02-29T00:00:00.999Z")
        XCTAssertEqual(RFC3339.format(-1), "1969-12-31T23:59:59.999Z")
        XCTAssertEqual(RFC3339.format(253_402_300_799_999), "9999-12-31T23:59:59.999Z")
    }

    func testFormatAlwaysHasTheWireShape() {
        let pattern = #"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$"#
        let re = try! NSRegularExpression(pattern: pattern)
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let ms = Millis.random(in: 0..<4_102_444_800_000, using: &rng) // up to 2100
            let s = RFC3339.format(ms)
            XCTAssertEqual(s.utf8.count, 24, s)
            XCTAssertNotNil(re.firstMatch(in: s, range: NSRange(location: 0, length: s.utf16.count)), s)
            XCTAssertEqual(RFC3339.parse(s), ms, s)
        }
    }

    func testFormatRoundTripsEveryFourDigitYear() {
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<5000 {
            let ms = Millis.random(in: -62_167_219_200_000...253_402_300_799_999, using: &rng) // 0000 to 9999
            XCTAssertEqual(RFC3339.parse(RFC3339.format(ms)), ms, RFC3339.format(ms))
        }
        XCTAssertEqual(RFC3339.format(-62_167_219_200_000), "0000-01-01T00:00:00.000Z")
        XCTAssertEqual(RFC3339.format(253_402_300_800_000), "10000-01-01T00:00:00.000Z")
    }

    func testParseZuluWithAndWithoutFraction() {
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00.000Z"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00Z"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-22t10:00:00z"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00.5Z"), T0 + 500)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00.05Z"), T0 + 50)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00.123Z"), T0 + 123)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00.123456789Z"), T0 + 123, "sub-millisecond digits truncate")
        XCTAssertEqual(RFC3339.parse("1970-01-01T00:00:00Z"), 0)
    }

    func testParseOffsets() {
        XCTAssertEqual(RFC3339.parse("2026-11-22T11:00:00+01:00"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-22T04:30:00.000-05:30"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00+00:00"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-22T10:00:00-00:00"), T0)
        XCTAssertEqual(RFC3339.parse("2026-11-23T09:59:00.250+23:59"), T0 + 250)
        XCTAssertEqual(RFC3339.parse("2026-11-21T23:00:00-11:00"), T0)
    }

    func testParseRefusesImpossibleOrMalformedTimes() {
        for s in [
            "2026-02-30T10:00:00Z", "2026-02-29T10:00:00Z", "2100-02-29T00:00:00Z", "2026-04-31T00:00:00Z",
            "2026-13-01T00:00:00Z", "2026-00-10T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-32T00:00:00Z",
            "2026-11-22T24:00:00Z", "2026-11-22T10:60:00Z", "2026-11-22T10:00:60Z",
            "2026-11-22T10:00:00", "2026-11-22T10:00:00.000", "2026-11-22", "2026-11-22 10:00:00Z",
            "2026-11-22T10:00:00.Z", "2026-11-22T10:00:00+0100", "2026-11-22T10:00:00+01", "2026-11-22T10:00:00+24:00",
            "2026-11-22T10:00:00+01:60", "2026-11-22T10:00:00ZZ", "2026-11-22T10:00:00Z ", " 2026-11-22T10:00:00Z",
            "26-11-22T10:00:00Z", "2026-1-22T10:00:00Z", "2026/11/22T10:00:00Z", "2026-11-22T10:0:00Z",
            "2026-11-22T10:00:00.12a Z", "2026-11-22T1a:00:00Z", "", "Z", "tomorrow", "2026-11-22T10:00:00.000Zjunk",
            "2026-11-22T10:00:00+01:00:00", "+2026-11-22T10:00:00Z", "2026-11-22T10:00:00 Z",
        ] {
            XCTAssertNil(RFC3339.parse(s), s)
        }
    }

    func testLeapYears() {
        XCTAssertNotNil(RFC3339.parse("2024-02-29T00:00:00Z"))
        XCTAssertNotNil(RFC3339.parse("2000-02-29T00:00:00Z"))
        XCTAssertNil(RFC3339.parse("1900-02-29T00:00:00Z"))
        XCTAssertEqual(RFC3339.parse("2024-03-01T00:00:00Z")! - RFC3339.parse("2024-02-28T00:00:00Z")!, 2 * 86_400_000)
        XCTAssertEqual(RFC3339.parse("2026-12-31T23:59:59.999Z").map { $0 + 1 }, RFC3339.parse("2027-01-01T00:00:00Z"))
    }

    func testRoundTrip() {
        for s in ["2026-11-22T10:00:00.000Z", "1999-12-31T23:59:59.999Z", "2024-02-29T12:34:56.789Z",
                  "1970-01-01T00:00:00.001Z", "2038-01-19T03:14:08.000Z"] {
            XCTAssertEqual(RFC3339.parse(s).map(RFC3339.format), s)
        }
        XCTAssertEqual(RFC3339.parse("2026-11-22T11:00:00.5+01:00").map(RFC3339.format), "2026-11-22T10:00:00.500Z")
    }

    func testWallClockIsNow() {
        let a = WallClock.now()
        XCTAssertGreaterThan(a, T0 - 365 * 86_400_000 * 2, "clock reads something plausible")
        XCTAssertLessThanOrEqual(a, WallClock.now())
    }
}
