@testable import HeraldClient
import HeraldCore
import XCTest

/// How the client's state takes preferences (PROTOCOL.md 16.2): a reset's
/// whole, a change's only when newer than what it holds.
final class LocalStatePreferencesTests: XCTestCase {
    func prefs(_ version: Int64, muted: String? = nil) -> Preferences {
        Preferences(groups: muted.map { [$0: Channels(inbox: false)] } ?? [:], version: version, updatedAt: version)
    }

    func testAResetIsTakenWholeAndAChangeOnlyWhenNewer() {
        var s = LocalState()
        let reset = s.apply(.reset([], cursor: 5, epoch: "e", final: true, preferences: prefs(3, muted: "ads")))
        XCTAssertEqual(s.preferences, prefs(3, muted: "ads"))
        XCTAssertTrue(reset.events.contains(.preferences(prefs(3, muted: "ads"))))

        // A save the reset already held (read after its cursor) comes again: ignored.
        let old = s.apply(.changes([Change(seq: 6, op: .preferences(prefs(2)))], cursor: nil))
        XCTAssertEqual(s.preferences, prefs(3, muted: "ads"))
        XCTAssertFalse(old.events.contains { if case .preferences = $0 { true } else { false } })
        XCTAssertEqual(s.cursor, 6, "the cursor moves past it all the same")

        let newer = s.apply(.changes([Change(seq: 7, op: .preferences(prefs(4)))], cursor: nil))
        XCTAssertEqual(s.preferences, prefs(4))
        XCTAssertTrue(newer.needsSave)

        // A feed that lost its history starts again at 0: its reset wins.
        _ = s.apply(.reset([], cursor: 1, epoch: "f", final: true, preferences: .unsaved))
        XCTAssertEqual(s.preferences, .unsaved)
        // Only the final frame's are taken.
        _ = s.apply(.reset([], cursor: 2, epoch: "g", final: false, preferences: prefs(9)))
        XCTAssertEqual(s.preferences, .unsaved)
    }
}
