import XCTest
import HeraldTestSupport
import HeraldCore

// Counts as the tests expect them, computed apart from the stores' own code.

/// A targeting's identity for counts: platforms as a set, tags by source.
func countsKey(_ t: Targeting) -> String {
    let platforms = t.platforms.map { ps in Platform.allCases.filter(Set(ps).contains).map(\.rawValue).joined(separator: ",") }
    return "\(platforms ?? "*")|\(t.tags?.source ?? "*")"
}

/// The counts a full scan of `notes` (a user's live notifications) gives.
func scannedCounts(_ notes: [Notification]) -> [String: TargetingCounts] {
    var out: [String: TargetingCounts] = [:]
    for n in notes {
        let canonical = Targeting(platforms: n.targetPlatforms.map { ps in Platform.allCases.filter(Set(ps).contains) },
                                  tags: n.targetTags)
        var c = out[countsKey(canonical)] ?? TargetingCounts(targeting: canonical)
        c.total += 1
        if n.readState == .unread { c.unread += 1 }
        if n.seenState == .unseen { c.unseen += 1 }
        if n.userActionState == .noInteraction { c.noInteraction += 1 }
        out[countsKey(canonical)] = c
    }
    return out
}

/// `counts` by `countsKey`, failing on what a store must never return: two
/// entries for one targeting, an entry with no notification, a targeting
/// whose platforms are not in `Platform.allCases` order without repeats.
func keyed(_ counts: [TargetingCounts], file: StaticString = #filePath, line: UInt = #line) -> [String: TargetingCounts] {
    var out: [String: TargetingCounts] = [:]
    for c in counts {
        let key = countsKey(c.targeting)
        XCTAssertNil(out[key], "two entries for \(key)", file: file, line: line)
        XCTAssertGreaterThan(c.total, 0, "an empty entry for \(key)", file: file, line: line)
        if let ps = c.targeting.platforms {
            XCTAssertEqual(ps, Platform.allCases.filter(ps.contains), "targeting not canonical", file: file, line: line)
        }
        out[key] = c
    }
    return out
}

/// Asserts that `store`'s counts of `user` are what a scan of its history gives.
func assertCountsMatchHistory(_ store: StoreReading, _ user: UserKey, _ message: @autoclosure () -> String = "",
                              file: StaticString = #filePath, line: UInt = #line) throws {
    let history = try store.history(user, after: nil, limit: 1_000_000)
    XCTAssertEqual(keyed(try store.counts(user), file: file, line: line), scannedCounts(history),
                   "\(user) \(message())", file: file, line: line)
}


/// SQL (SQLite's and PostgreSQL's alike) that takes each of `fragments`
/// out of the stored JSON of changes and notification rows, as an older
/// schema wrote them: the first part of a test's downgrade.
func withoutInTheStoredJSON(_ fragments: [String]) -> String {
    func strip(_ column: String) -> String {
        fragments.reduce(column) { "replace(\($0), '\($1)', '')" }
    }
    return """
        UPDATE changes SET change = \(strip("change"));
        UPDATE notifications SET json = \(strip("json")) WHERE json <> '';

        """
}

/// Before version 11 (SQLite; 10 on PostgreSQL) there was no `seenState`.
let withoutSeenStateInTheStoredJSON = withoutInTheStoredJSON([#","seenState":"unseen""#, #","seenState":"seen""#])
/// Before version 12 (SQLite; 11 on PostgreSQL) there was no
/// `snoozedUntil` (the downgraded tests' notifications have none set).
let withoutSnoozedUntilInTheStoredJSON = withoutInTheStoredJSON([#","snoozedUntil":null"#])
