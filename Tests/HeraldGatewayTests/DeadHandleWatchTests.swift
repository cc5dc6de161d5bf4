import XCTest
@testable import HeraldGateway

/// When a service's answers for one app are judged to call handles dead
/// for one reason: a configuration error rather than the devices' doing.
final class DeadHandleWatchTests: XCTestCase {
    func testMoreThanHalfOfAtLeastTenAnswersForOneReason() {
        var w = DeadHandleWatch()
        for _ in 0..<4 { XCTAssertNil(w.note(nil)) }
        for _ in 0..<5 { XCTAssertNil(w.note("BadDeviceToken")) }
        // 9 answers: too few, whatever they say.
        XCTAssertNil(w.suspect)
        // 10 answers, 5 dead: half is not most.
        XCTAssertNil(w.note(nil))
        XCTAssertEqual(w.note("BadDeviceToken"), .suspect("BadDeviceToken"), "6 of 11")
        XCTAssertNil(w.note("BadDeviceToken"), "said once")
        XCTAssertEqual(w.suspect, "BadDeviceToken")
    }

    func testDeadHandlesForSeveralReasonsAreNotOneMisconfiguration() {
        var w = DeadHandleWatch()
        for i in 0..<20 { XCTAssertNil(w.note(["Unregistered", "BadDeviceToken", nil][i % 3])) }
        XCTAssertNil(w.suspect)
    }

    func testOnlyTheLastTwentyCountAndTheJudgementClears() {
        var w = DeadHandleWatch()
        for _ in 0..<10 { _ = w.note("DeviceTokenNotForTopic") }
        XCTAssertEqual(w.suspect, "DeviceTokenNotForTopic")
        // 10 dead then 10 delivered: half of the last 20.
        var changes: [DeadHandleWatch.Change] = []
        for _ in 0..<10 { if let c = w.note(nil) { changes.append(c) } }
        XCTAssertEqual(changes, [.cleared("DeviceTokenNotForTopic")])
        XCTAssertNil(w.suspect)
        for _ in 0..<11 { changes += [w.note("Unregistered")].compactMap { $0 } }
        XCTAssertEqual(changes.last, .suspect("Unregistered"), "11 of the last 20")
    }
}
