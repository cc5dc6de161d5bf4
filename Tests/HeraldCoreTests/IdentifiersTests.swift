import XCTest
@testable import HeraldCore

final class IdentifiersTests: XCTestCase {

    func testUserIdRules() {
        XCTAssertTrue(Identifiers.isUserId("alice"))
        XCTAssertTrue(Identifiers.isUserId("a"))
        XCTAssertTrue(Identifiers.isUserId("A-Z.a_z@0:9"))
        XCTAssertTrue(Identifiers.isUserId("user@example.com"))
        XCTAssertTrue(Identifiers.isUserId(String(repeating: "x", count: 128)))
        XCTAssertFalse(Identifiers.isUserId(String(repeating: "x", count: 129)))
        XCTAssertFalse(Identifiers.isUserId(""))
        for bad in ["a b", "a/b", "a#b", "a+b", "é", "a\u{0}", "a\n", "a%20", "a?b", "a,b", "ü", "a*", "'a'", "a\"",
                    "\u{FF21}", "a\\b", "(a)", "a!"] {
            XCTAssertFalse(Identifiers.isUserId(bad), bad)
        }
    }

    func testAppIdRules() {
        XCTAssertTrue(Identifiers.isAppId("com.example.todo"))
        XCTAssertTrue(Identifiers.isAppId("a-b_c.D9"))
        XCTAssertTrue(Identifiers.isAppId(String(repeating: "a", count: 64)))
        XCTAssertFalse(Identifiers.isAppId(String(repeating: "a", count: 65)))
        XCTAssertFalse(Identifiers.isAppId(""))
        for bad in ["a@b", "a:b", "a b", "a/b", "a#b", "é"] {
            XCTAssertFalse(Identifiers.isAppId(bad), bad)
        }
    }

    func testTagRules() {
        XCTAssertTrue(Identifiers.isTag("lang:it"))
        XCTAssertTrue(Identifiers.isTag("a_b@c#d.e:f-G9"))
        XCTAssertTrue(Identifiers.isTag(String(repeating: "t", count: 160)))
        XCTAssertFalse(Identifiers.isTag(String(repeating: "t", count: 161)))
        XCTAssertFalse(Identifiers.isTag(""))
        for bad in ["a b", "a&b", "a|b", "!a", "(a)", "a/b", "a+b", "é", "a,b", "a\t"] {
            XCTAssertFalse(Identifiers.isTag(bad), bad)
        }
    }

    // MARK: notification ids

    static let crockford = Set("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

    func testNotificationIdShape() {
        for _ in 0..<200 {
            let id = NotificationID.make()
            let b = Array(id.utf8)
            XCTAssertEqual(b.count, 28, id)
            XCTAssertEqual(Array(b.prefix(2)), Array("n_".utf8), id)
            XCTAssertTrue(b.dropFirst(2).allSatisfy { Self.crockford.contains($0) }, id)
            // 128 bits in 26 digits: the first digit carries only 3 bits.
            XCTAssertLessThanOrEqual(b[2], UInt8(ascii: "7"), id)
            XCTAssertTrue(Identifiers.isUserId(id), "ids pass the id rule used for path segments")
        }
    }

    func testNotificationIdsAreUnique() {
        var seen = Set<String>()
        for _ in 0..<20_000 { seen.insert(NotificationID.make(now: T0)) }
        XCTAssertEqual(seen.count, 20_000, "same millisecond, still unique")
        for _ in 0..<5_000 { seen.insert(NotificationID.make()) }
        XCTAssertEqual(seen.count, 25_000)
    }

    func testNotificationIdByteOrderFollowsCreationTime() {
        var times: [Millis] = [0, 1, 2, 999, 1000, T0 - 1, T0, T0 + 1, T0 + 1000, T0 + 86_400_000, 281_474_976_710_655]
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<300 { times.append(Millis.random(in: 0..<4_102_444_800_000, using: &rng)) }
        times = Array(Set(times)).sorted()
        let ids = times.map { NotificationID.make(now: $0) }
        for k in 1..<ids.count {
            XCTAssertTrue(Array(ids[k - 1].utf8).lexicographicallyPrecedes(Array(ids[k].utf8)),
                          "\(times[k - 1]) → \(ids[k - 1]) should sort before \(times[k]) → \(ids[k])")
            XCTAssertLessThan(ids[k - 1], ids[k])
        }
    }

    func testNotificationIdEncodesTheTimeInTheFirstTenDigits() {
        // ULID: the first 10 digits are the 48-bit millisecond time.
        let id = NotificationID.make(now: T0)
        let digits = Array(id.utf8.dropFirst(2).prefix(10))
        let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)
        var t: Int64 = 0
        for d in digits { t = t * 32 + Int64(alphabet.firstIndex(of: d)!) }
        XCTAssertEqual(t, T0)
    }

    /// The bound history pages start from (`NotificationID.above`).
    func testAboveAMillisecondIsBetweenItsIdsAndTheNext() {
        for ms: Millis in [0, 1, T0 - 1, T0, 281_474_976_710_654] {
            let bound = NotificationID.above(millisecond: ms)
            for _ in 0..<50 {
                XCTAssertLessThan(NotificationID.make(now: ms), bound)
                XCTAssertLessThanOrEqual(bound, NotificationID.make(now: ms + 1))
            }
        }
        XCTAssertEqual(NotificationID.above(millisecond: -1), "n_" + String(repeating: "0", count: 26))
        let last: Millis = 281_474_976_710_655   // the last of 48 bits
        for ms in [last, .max] { XCTAssertLessThan(NotificationID.make(now: last), NotificationID.above(millisecond: ms)) }
    }

    func testRandomHex() {
        let h = Random.hex(16)
        XCTAssertEqual(h.count, 32)
        XCTAssertTrue(h.allSatisfy { "0123456789abcdef".contains($0) })
        XCTAssertNotEqual(Random.hex(16), h)
    }
}
