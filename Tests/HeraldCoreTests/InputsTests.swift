import XCTest
@testable import HeraldCore

/// A publish body as the HTTP layer reads it: the draft, then `finish()`.
func readDraft(_ text: String) throws(HeraldError) -> NotificationDraft {
    var f = try Fields(bytes: bytes(text))
    let d = try NotificationDraft(reading: &f)
    try f.finish()
    return d
}

final class NotificationDraftTests: XCTestCase {
    let minimal = #""appNotificationId":"task-42","payload":{"title":"Hi"}"#

    func draft(_ extra: String = "", file: StaticString = #filePath, line: UInt = #line) -> NotificationDraft? {
        do { return try readDraft("{" + minimal + extra + "}") } catch {
            XCTFail("\(extra): \(error)", file: file, line: line)
            return nil
        }
    }

    func refused(_ body: String, _ code: ErrorCode = .badRequest, file: StaticString = #filePath, line: UInt = #line) {
        guard let e = heraldError({ () throws(HeraldError) in try readDraft(body) }, file: file, line: line) else { return }
        XCTAssertEqual(e.code, code, "\(body.prefix(120)): \(e)", file: file, line: line)
    }

    func refusedExtra(_ extra: String, file: StaticString = #filePath, line: UInt = #line) {
        refused("{" + minimal + extra + "}", file: file, line: line)
    }

    func testMinimalDraftDefaults() {
        let d = draft()!
        XCTAssertEqual(d.appNotificationId, "task-42")
        XCTAssertEqual(d.payload, ["title": "Hi"])
        XCTAssertEqual(d.priority, .normal)
        XCTAssertNil(d.groupName)
        XCTAssertNil(d.displayTimeToLive)
        XCTAssertNil(d.targetPlatforms)
        XCTAssertNil(d.targetTags)
        XCTAssertEqual(d.expiry, .default)
        XCTAssertEqual(try d.expiresAt(now: T0), T0 + 30 * 86_400_000)
    }

    func testAllFields() {
        let d = draft(#","priority":"high","groupName":"tasks","displayTimeToLive":600,"targetPlatforms":["web","ios","web"],"targetTags":"lang:it && !muted","ttlSeconds":60"#)!
        XCTAssertEqual(d.priority, .high)
        XCTAssertEqual(d.groupName, "tasks")
        XCTAssertEqual(d.displayTimeToLive, 600)
        XCTAssertEqual(d.targetPlatforms, [.web, .ios])
        XCTAssertEqual(d.targetTags?.source, "lang:it && !muted")
        XCTAssertEqual(d.expiry, .ttl(60))
        XCTAssertEqual(try d.expiresAt(now: T0), T0 + 60_000)
    }

    func testNullOptionalFieldsCountAsAbsent() {
        let d = draft(#","priority":null,"groupName":null,"displayTimeToLive":null,"targetPlatforms":null,"targetTags":null,"ttlSeconds":null,"expiresAt":null"#)!
        XCTAssertEqual(d.priority, .normal)
        XCTAssertNil(d.groupName)
        XCTAssertNil(d.targetPlatforms)
        XCTAssertNil(d.targetTags)
        XCTAssertEqual(d.expiry, .default)
    }

    func testPayloadKeepsKeyOrderAndNumbers() {
        let d = try! readDraft(#"{"appNotificationId":"a","payload":{"z":1.50,"a":{"y":[1e3]},"m":null}}"#)
        XCTAssertEqual(JSON.object(d.payload).encodedString, #"{"z":1.50,"a":{"y":[1e3]},"m":null}"#)
    }

    func testRequiredFields() {
        refused(#"{"payload":{}}"#)
        refused(#"{"appNotificationId":"a"}"#)
        refused(#"{"appNotificationId":null,"payload":{}}"#)
        refused(#"{"appNotificationId":"a","payload":null}"#)
        refused("{}")
        XCTAssertNotNil(try? readDraft(#"{"appNotificationId":"a","payload":{}}"#), "an empty payload object is fine")
    }

    func testBodyMustBeAJSONObject() {
        for body in ["", "[]", "\"x\"", "null", "{", #"{"appNotificationId":"a","payload":{},}"#, "{} x"] {
            refused(body)
        }
        XCTAssertEqual(heraldError({ () throws(HeraldError) in try Fields(bytes: [0x7B, 0xFF, 0x7D]) })?.code, .badRequest)
    }

    func testAppNotificationIdRules() {
        for bad in [#""""#, #""a b""#, #""é""#, #""a/b""#, "1", "true", "[]", #""\#(String(repeating: "x", count: 129))""#] {
            refused(#"{"appNotificationId":\#(bad),"payload":{}}"#)
        }
        XCTAssertNotNil(try? readDraft(#"{"appNotificationId":"\#(String(repeating: "x", count: 128))","payload":{}}"#))
    }

    func testPayloadMustBeAnObject() {
        for p in ["[]", "[1]", #""text""#, "1", "true"] {
            refused(#"{"appNotificationId":"a","payload":\#(p)}"#)
        }
    }

    func testPayloadSizeLimitIsOnTheEncodedObject() {
        // {"k":"<n bytes>"} encodes to n + 8 bytes.
        let atLimit = String(repeating: "x", count: Limits.maxPayloadBytes - 8)
        let d = try? readDraft(#"{"appNotificationId":"a","payload":{"k":"\#(atLimit)"}}"#)
        XCTAssertEqual(d.map { JSON.object($0.payload).encoded.count }, 65_536)
        refused(#"{"appNotificationId":"a","payload":{"k":"\#(atLimit)x"}}"#, .tooLarge)
        XCTAssertEqual(HeraldError(.tooLarge, "").code.httpStatus, 413)
        // Measured encoded: whitespace in the request does not count, escapes do.
        let spaced = #"{"appNotificationId":"a","payload":{  "k"  :  "\#(atLimit)"  }}"#
        XCTAssertNotNil(try? readDraft(spaced))
        let newlines = String(repeating: "\\n", count: (Limits.maxPayloadBytes - 8) / 2 + 1)
        refused(#"{"appNotificationId":"a","payload":{"k":"\#(newlines)"}}"#, .tooLarge)
        // A body over the limit whose payload encodes within it: measured, and taken.
        let escaped = String(repeating: "\\u0062", count: 20_000)
        XCTAssertEqual(try? readDraft(#"{"appNotificationId":"a","payload":{"k":"\#(escaped)"}}"#).payload["k"],
                       .string(String(repeating: "b", count: 20_000)))
    }

    func testPriority() {
        XCTAssertEqual(draft(#","priority":"normal""#)?.priority, .normal)
        XCTAssertEqual(draft(#","priority":"high""#)?.priority, .high)
        for bad in [#""urgent""#, #""HIGH""#, #""""#, "1", "true", #"["high"]"#] {
            refusedExtra(#","priority":\#(bad)"#)
        }
    }

    func testGroupNameAndDisplayTimeToLive() {
        refusedExtra(#","groupName":"""#)
        refusedExtra(#","groupName":5"#)
        refusedExtra(#","groupName":"\#(String(repeating: "g", count: 257))""#)
        XCTAssertNotNil(draft(#","groupName":"\#(String(repeating: "g", count: 256))""#))
        XCTAssertEqual(draft(#","displayTimeToLive":0"#)?.displayTimeToLive, 0)
        for bad in ["-1", "1.5", #""60""#, "1e2", "true"] {
            refusedExtra(#","displayTimeToLive":\#(bad)"#)
        }
    }

    func testTargetPlatforms() {
        XCTAssertEqual(draft(#","targetPlatforms":["web","ios","android","windows","other"]"#)?.targetPlatforms,
                       [.web, .ios, .android, .windows, .other])
        for bad in [#""web""#, #"["mac"]"#, "[1]", #"["web",null]"#, #"["Web"]"#, #"{"web":true}"#] {
            refusedExtra(#","targetPlatforms":\#(bad)"#)
        }
    }

    func testTargetTags() {
        XCTAssertEqual(draft(#","targetTags":"a || b""#)?.targetTags?.root, .or(.tag("a"), .tag("b")))
        for bad in [#""a ||""#, #""""#, "5", #"["a"]"#, #""a & b""#,
                    #""\#((0..<21).map { "t\($0)" }.joined(separator: "||"))""#] {
            refusedExtra(#","targetTags":\#(bad)"#)
        }
    }

    func testTTLSecondsRange() {
        XCTAssertEqual(draft(#","ttlSeconds":1"#)?.expiry, .ttl(1))
        XCTAssertEqual(draft(#","ttlSeconds":31536000"#)?.expiry, .ttl(31_536_000))
        for bad in ["0", "-1", "31536001", "1.5", #""60""#, "99999999999999999999"] {
            refusedExtra(#","ttlSeconds":\#(bad)"#)
        }
    }

    func testExpiresAt() throws {
        let d = draft(#","expiresAt":"2026-11-23T10:00:00.000Z""#)!
        XCTAssertEqual(d.expiry, .at(T0 + 86_400_000))
        XCTAssertEqual(try d.expiresAt(now: T0), T0 + 86_400_000)
        XCTAssertEqual(draft(#","expiresAt":"2026-11-23T11:00:00+01:00""#)?.expiry, .at(T0 + 86_400_000))
        refusedExtra(#","expiresAt":"tomorrow""#)
        refusedExtra(#","expiresAt":"2026-02-30T00:00:00Z""#)
        refusedExtra(#","expiresAt":1795341600000"#)
    }

    func testExpiresAtAndTTLSecondsAreExclusive() {
        refusedExtra(#","ttlSeconds":60,"expiresAt":"2026-11-23T10:00:00.000Z""#)
        XCTAssertEqual(draft(#","ttlSeconds":60,"expiresAt":null"#)?.expiry, .ttl(60))
    }

    func testExpiresAtMustBeFutureAndWithin365Days() {
        func at(_ ms: Millis) -> NotificationDraft {
            var d = NotificationDraft(appNotificationId: "a", payload: [:]); d.expiry = .at(ms); return d
        }
        XCTAssertEqual(heraldError({ () throws(HeraldError) in try at(T0 - 1).expiresAt(now: T0) })?.code, .badRequest)
        XCTAssertEqual(heraldError({ () throws(HeraldError) in try at(T0).expiresAt(now: T0) })?.code, .badRequest, "now is not future")
        XCTAssertEqual(try at(T0 + 1).expiresAt(now: T0), T0 + 1)
        let year = Limits.maxExpirySeconds * 1000
        XCTAssertEqual(try at(T0 + year).expiresAt(now: T0), T0 + year)
        XCTAssertEqual(heraldError({ () throws(HeraldError) in try at(T0 + year + 1).expiresAt(now: T0) })?.code, .badRequest)
        // The draft refuses it when it is turned into a notification.
        XCTAssertEqual(heraldError({ () throws(HeraldError) in
            try at(T0 - 1).notification(replacing: nil, userId: "alice", now: T0)
        })?.code, .badRequest)
    }

    func testUnknownFieldIsRefused() {
        refusedExtra(#","titel":"typo""#)
        refusedExtra(#","userId":"alice""#)
        refusedExtra(#","readState":"read""#)
        refusedExtra(#","extra":null"#)
    }

    // MARK: making the notification

    func testNewNotification() throws {
        let d = draft(#","priority":"high","groupName":"g","targetPlatforms":["ios"],"ttlSeconds":100"#)!
        let n = try d.notification(replacing: nil, userId: "alice", now: T0)
        XCTAssertTrue(n.id.hasPrefix("n_"))
        XCTAssertEqual(n.id.utf8.count, 28)
        XCTAssertEqual(n.appNotificationId, "task-42")
        XCTAssertEqual(n.userId, "alice")
        XCTAssertEqual(n.createdAt, T0)
        XCTAssertEqual(n.updatedAt, T0)
        XCTAssertEqual(n.expiresAt, T0 + 100_000)
        XCTAssertEqual(n.readState, .unread)
        XCTAssertEqual(n.userActionState, .noInteraction)
        XCTAssertEqual(n.version, 1)
        XCTAssertEqual(n.priority, .high)
        XCTAssertEqual(n.groupName, "g")
        XCTAssertEqual(n.targetPlatforms, [.ios])
    }

    func testReplacingKeepsIdAndCreatedAtResetsStateAndClearsAbsentFields() throws {
        var old = Note.sample(platforms: [.web], tags: "a", read: .read, version: 4)
        old.userActionState = .dismissed
        old.priority = .high
        old.groupName = "g"
        old.displayTimeToLive = 60
        let later = T0 + 5_000
        let d = try readDraft(#"{"appNotificationId":"task-42","payload":{"v":2}}"#)
        let n = try d.notification(replacing: old, userId: "alice", now: later)
        XCTAssertEqual(n.id, old.id)
        XCTAssertEqual(n.createdAt, old.createdAt)
        XCTAssertEqual(n.updatedAt, later)
        XCTAssertEqual(n.expiresAt, later + 30 * 86_400_000, "expiry recomputed from the replace")
        XCTAssertEqual(n.readState, .unread)
        XCTAssertEqual(n.userActionState, .noInteraction)
        XCTAssertEqual(n.version, 5)
        XCTAssertEqual(n.payload, ["v": 2])
        XCTAssertEqual(n.priority, .normal)
        XCTAssertNil(n.groupName)
        XCTAssertNil(n.displayTimeToLive)
        XCTAssertNil(n.targetPlatforms)
        XCTAssertNil(n.targetTags)
    }
}

final class BulkSendTests: XCTestCase {
    let fields = #""appNotificationId":"promo","payload":{"t":1}"#

    func send(_ extra: String, file: StaticString = #filePath, line: UInt = #line) -> BulkSend? {
        do { return try BulkSend(bytes: bytes("{" + extra + "," + fields + "}")) } catch {
            XCTFail("\(extra.prefix(100)): \(error)", file: file, line: line)
            return nil
        }
    }

    func refused(_ extra: String, file: StaticString = #filePath, line: UInt = #line) {
        let body = "{" + extra + (extra.isEmpty ? "" : ",") + fields + "}"
        assertBadRequest({ () throws(HeraldError) in try BulkSend(bytes: bytes(body)) }, String(extra.prefix(100)), file: file, line: line)
    }

    func ids(_ list: [String]) -> String { #""userIds":[\#(list.map { "\"\($0)\"" }.joined(separator: ","))]"# }

    func testUserIds() {
        XCTAssertEqual(send(ids(["alice", "bob"]))?.audience, .users(["alice", "bob"]))
        XCTAssertEqual(send(ids(["alice"]))?.draft.appNotificationId, "promo")
        XCTAssertEqual(send(ids((0..<1000).map { "u\($0)" }))?.audience, .users((0..<1000).map { "u\($0)" }))
    }

    func testDuplicatesCountOnce() {
        XCTAssertEqual(send(ids(["bob", "alice", "bob", "alice", "carol"]))?.audience, .users(["bob", "alice", "carol"]))
        XCTAssertEqual(send(ids(Array(repeating: "alice", count: 5)))?.audience, .users(["alice"]))
    }

    /// SPEC 3: `userIds` (1–1000, duplicates count once): 1000 distinct users
    /// named with one repeat are 1000 users, within the limit.
    func testLimitCountsDistinctUsers() {
        let list = (0..<1000).map { "u\($0)" } + ["u0"]
        XCTAssertEqual(send(ids(list)).map { if case .users(let u) = $0.audience { u.count } else { -1 } }, 1000)
    }

    func testUserIdsBounds() {
        refused(#""userIds":[]"#)
        refused(ids((0..<1001).map { "u\($0)" }))
        refused(#""userIds":["a b"]"#)
        refused(#""userIds":["ok", 5]"#)
        refused(#""userIds":[null]"#)
        refused(#""userIds":"alice""#)
        refused(#""userIds":[""]"#)
    }

    func testTagExpressionAudience() {
        let s = send(#""tagExpression":"lang:it && !muted""#)
        XCTAssertEqual(s?.audience, .tags(try! TagExpression.parse("lang:it && !muted")))
        XCTAssertEqual(s?.draft.targetTags?.source, "lang:it && !muted", "targetTags is the expression")
        refused(#""tagExpression":"a &&""#)
        refused(#""tagExpression":"""#)
        refused(#""tagExpression":5"#)
        refused(#""tagExpression":"a","targetTags":"b""#)
    }

    func testExactlyOneAudience() {
        refused("")
        refused(#""userIds":["a"],"tagExpression":"x""#)
        refused(#""userIds":null,"tagExpression":null"#)
        XCTAssertNotNil(send(#""userIds":["a"],"tagExpression":null"#))
    }

    func testDraftFieldsAreValidatedToo() {
        refused(ids(["a"]) + #","priority":"urgent""#)
        refused(ids(["a"]) + #","unknown":1"#)
        refused(ids(["a"]) + #","expiresAt":"2000-01-01T00:00:00Z""#)
        refused(ids(["a"]) + #","ttlSeconds":60,"expiresAt":"2999-01-01T00:00:00Z""#)
        assertBadRequest({ () throws(HeraldError) in try BulkSend(bytes: bytes(#"{"userIds":["a"],"payload":{}}"#)) })
        XCTAssertEqual(heraldError({ () throws(HeraldError) in
            try BulkSend(bytes: bytes(#"{"userIds":["a"],"appNotificationId":"x","payload":{"k":"\#(String(repeating: "x", count: 70_000))"}}"#))
        })?.code, .tooLarge)
    }
}

final class StateUpdateTests: XCTestCase {
    func update(_ body: String, ifMatch: String? = nil) throws(HeraldError) -> StateUpdate {
        try StateUpdate(bytes: bytes(body), ifMatch: ifMatch)
    }

    func testFields() throws {
        XCTAssertEqual(try update(#"{"readState":"read"}"#), StateUpdate(readState: .read))
        XCTAssertEqual(try update(#"{"userActionState":"dismissed"}"#), StateUpdate(userActionState: .dismissed))
        XCTAssertEqual(try update(#"{"readState":"unread","userActionState":"snoozed"}"#),
                       StateUpdate(readState: .unread, userActionState: .snoozed))
        for s in UserActionState.allCases {
            XCTAssertEqual(try update(#"{"userActionState":"\#(s.rawValue)"}"#).userActionState, s)
        }
    }

    func testAtLeastOneField() {
        for body in ["{}", #"{"readState":null}"#, #"{"readState":null,"userActionState":null}"#, "", "[]", "null"] {
            assertBadRequest({ () throws(HeraldError) in try update(body) }, body)
        }
    }

    func testBadValues() {
        for body in [#"{"readState":"seen"}"#, #"{"readState":true}"#, #"{"userActionState":"clicked"}"#,
                     #"{"readState":"read","version":3}"#, #"{"readState":"read","ifVersion":3}"#,
                     #"{"readState":"Read"}"#, #"{"readState":"read",}"#] {
            assertBadRequest({ () throws(HeraldError) in try update(body) }, body)
        }
    }

    func testIfMatchWithAndWithoutQuotes() throws {
        XCTAssertEqual(try update(#"{"readState":"read"}"#, ifMatch: "\"3\"").ifVersion, 3)
        XCTAssertEqual(try update(#"{"readState":"read"}"#, ifMatch: "3").ifVersion, 3)
        XCTAssertEqual(try update(#"{"readState":"read"}"#, ifMatch: " \"12\" ").ifVersion, 12)
        XCTAssertEqual(try update(#"{"readState":"read"}"#, ifMatch: "W/\"7\"").ifVersion, 7)
        XCTAssertNil(try update(#"{"readState":"read"}"#).ifVersion)
        XCTAssertEqual(try StateUpdate.parseIfMatch("9223372036854775807"), Int64.max)
    }

    func testMalformedIfMatch() {
        for h in ["", "\"\"", "\"3", "3\"", "abc", "0", "\"0\"", "-1", "+3", "3.0", "1e2", "3,4", "\"3\" \"4\"", "*",
                  "'3'", "99999999999999999999", "\"\"3\"\"", "3 4", "٣"] {
            assertBadRequest({ () throws(HeraldError) in try StateUpdate.parseIfMatch(h) }, h)
            assertBadRequest({ () throws(HeraldError) in try update(#"{"readState":"read"}"#, ifMatch: h) }, h)
        }
    }

    func testApplied() {
        let n = Note.sample(version: 2)
        XCTAssertNil(StateUpdate(readState: .unread).applied(to: n, now: T0 + 1), "no-op")
        XCTAssertNil(StateUpdate(readState: .unread, userActionState: .noInteraction).applied(to: n, now: T0 + 1))
        let m = StateUpdate(readState: .read).applied(to: n, now: T0 + 1)
        XCTAssertEqual(m?.readState, .read)
        XCTAssertEqual(m?.userActionState, .noInteraction)
        XCTAssertEqual(m?.version, 3)
        XCTAssertEqual(m?.updatedAt, T0 + 1)
        XCTAssertEqual(m?.createdAt, n.createdAt)
        XCTAssertEqual(m?.id, n.id)
        let k = StateUpdate(readState: .unread, userActionState: .dismissed).applied(to: n, now: T0 + 2)
        XCTAssertEqual(k?.readState, .unread)
        XCTAssertEqual(k?.userActionState, .dismissed)
        XCTAssertEqual(k?.version, 3)
    }

    func testSeenStateField() throws {
        XCTAssertEqual(try update(#"{"seenState":"seen"}"#), StateUpdate(seenState: .seen))
        XCTAssertEqual(try update(#"{"seenState":"unseen","readState":"unread"}"#), StateUpdate(readState: .unread, seenState: .unseen))
        XCTAssertEqual(try update(#"{"seenState":"seen","readState":"read"}"#), StateUpdate(readState: .read, seenState: .seen))
        for body in [#"{"seenState":"read"}"#, #"{"seenState":true}"#, #"{"seenState":"Seen"}"#, #"{"seenState":null}"#,
                     #"{"readState":"read","seenState":"unseen"}"#] {
            assertBadRequest({ () throws(HeraldError) in try update(body) }, body)
        }
    }

    func testSnoozedUntilField() throws {
        let at = "2026-11-22T11:00:00.000Z", ms = try XCTUnwrap(RFC3339.parse(at))
        XCTAssertEqual(try update(#"{"userActionState":"snoozed","snoozedUntil":"\#(at)"}"#),
                       StateUpdate(userActionState: .snoozed, snoozedUntil: ms))
        XCTAssertEqual(try update(#"{"snoozedUntil":"\#(at)"}"#), StateUpdate(snoozedUntil: ms), "moves the time of a snoozed one")
        XCTAssertEqual(try update(#"{"snoozedUntil":"\#(at)","readState":"read"}"#), StateUpdate(readState: .read, snoozedUntil: ms))
        for body in [#"{"snoozedUntil":"tomorrow"}"#, #"{"snoozedUntil":1764500000000}"#, #"{"snoozedUntil":null}"#,
                     #"{"userActionState":"dismissed","snoozedUntil":"\#(at)"}"#,
                     #"{"userActionState":"noInteraction","snoozedUntil":"\#(at)"}"#] {
            assertBadRequest({ () throws(HeraldError) in try update(body) }, body)
        }
    }

    /// What only the notification and the time can refuse (SPEC section 11).
    func testSnoozeTimesAreCheckedAgainstTheNotificationAndNow() throws {
        let n = Note.sample(version: 2), now = T0 + 1000
        let snooze = { (until: Millis) in StateUpdate(userActionState: .snoozed, snoozedUntil: until) }
        XCTAssertNoThrow(try snooze(now + 1).check(against: n, now: now))
        XCTAssertNoThrow(try snooze(now + StateUpdate.maxSnoozeMillis).check(against: n, now: now))
        for bad in [snooze(now), snooze(now - 1), snooze(now + StateUpdate.maxSnoozeMillis + 1),
                    StateUpdate(snoozedUntil: now + 60_000)] {
            XCTAssertEqual(heraldError({ () throws(HeraldError) in try bad.check(against: n, now: now) })?.code, .badRequest, "\(bad)")
        }
        let snoozed = try XCTUnwrap(snooze(now + 60_000).applied(to: n, now: now))
        XCTAssertEqual(snoozed.userActionState, .snoozed)
        XCTAssertEqual(snoozed.snoozedUntil, now + 60_000)
        // Moving the time of a snoozed notification, alone.
        XCTAssertNoThrow(try StateUpdate(snoozedUntil: now + 120_000).check(against: snoozed, now: now))
        let moved = try XCTUnwrap(StateUpdate(snoozedUntil: now + 120_000).applied(to: snoozed, now: now + 1))
        XCTAssertEqual(moved.snoozedUntil, now + 120_000)
        XCTAssertEqual(moved.version, snoozed.version + 1)
        XCTAssertNil(StateUpdate(snoozedUntil: now + 120_000).applied(to: moved, now: now + 2), "the same time changes nothing")
        // Snoozed without a time stays so; any other action clears the time.
        XCTAssertNil(try XCTUnwrap(StateUpdate(userActionState: .snoozed).applied(to: snoozed, now: now + 3)).snoozedUntil)
        let dismissed = try XCTUnwrap(StateUpdate(userActionState: .dismissed).applied(to: snoozed, now: now + 4))
        XCTAssertNil(dismissed.snoozedUntil)
        // A read keeps the snooze and its time.
        XCTAssertEqual(try XCTUnwrap(StateUpdate(readState: .read).applied(to: snoozed, now: now + 5)).snoozedUntil, now + 60_000)
    }

    func testWakingMakesItNewToTheUser() throws {
        var n = Note.sample(read: .read, version: 4)
        n.userActionState = .snoozed
        n.snoozedUntil = T0 + 500
        let woken = n.woken(at: T0 + 600)
        XCTAssertEqual([woken.userActionState.rawValue, woken.readState.rawValue, woken.seenState.rawValue],
                       ["noInteraction", "unread", "unseen"])
        XCTAssertNil(woken.snoozedUntil)
        XCTAssertEqual(woken.version, 5)
        XCTAssertEqual(woken.updatedAt, T0 + 600)
        XCTAssertEqual(woken.createdAt, n.createdAt)
        XCTAssertEqual(n.at(.wake), T0 + 500)
        XCTAssertEqual(n.at(.expiry), n.expiresAt)
    }

    func testReadMakesSeenAndUnreadLeavesSeen() {
        let n = Note.sample(version: 2)
        XCTAssertEqual(n.seenState, .unseen)
        let read = StateUpdate(readState: .read).applied(to: n, now: T0 + 1)!
        XCTAssertEqual(read.readState, .read)
        XCTAssertEqual(read.seenState, .seen, "read makes it seen")
        XCTAssertEqual(read.version, 3, "in one change")
        let unread = StateUpdate(readState: .unread).applied(to: read, now: T0 + 2)!
        XCTAssertEqual(unread.readState, .unread)
        XCTAssertEqual(unread.seenState, .seen, "unread again leaves it seen")
        let seen = StateUpdate(seenState: .seen).applied(to: n, now: T0 + 3)!
        XCTAssertEqual(seen.seenState, .seen)
        XCTAssertEqual(seen.readState, .unread, "seen is not read")
        XCTAssertEqual(seen.version, 3)
        XCTAssertNil(StateUpdate(seenState: .seen).applied(to: seen, now: T0 + 4), "no-op")
        XCTAssertNil(StateUpdate(readState: .read).applied(to: read, now: T0 + 4), "no-op")
        XCTAssertEqual(StateUpdate(seenState: .unseen).applied(to: unread, now: T0 + 5)?.seenState, .unseen)
    }
}

final class DeviceRegistrationTests: XCTestCase {
    func reg(_ body: String) throws(HeraldError) -> DeviceRegistration { try DeviceRegistration(bytes: bytes(body)) }

    func tagList(_ tags: [String]) -> String { #"{"tags":[\#(tags.map { "\"\($0)\"" }.joined(separator: ","))]}"# }

    func testEmptyBodyChangesNothing() throws {
        XCTAssertEqual(try reg(""), DeviceRegistration())
        XCTAssertEqual(try reg(" \n"), DeviceRegistration())
        XCTAssertEqual(try reg("{}"), DeviceRegistration())
        XCTAssertEqual(try reg(#"{"platform":null,"tags":null}"#), DeviceRegistration())
    }

    func testPlatformAndTags() throws {
        let r = try reg(#"{"platform":"ios","tags":["lang:it","b","lang:it"]}"#)
        XCTAssertEqual(r.platform, .ios)
        XCTAssertEqual(r.tags, ["lang:it", "b"], "deduplicated, order kept")
        XCTAssertEqual(try reg(#"{"tags":[]}"#).tags, [])
    }

    func testTagLimit() throws {
        XCTAssertEqual(try reg(tagList((0..<60).map { "t\($0)" })).tags?.count, 60)
        assertBadRequest({ () throws(HeraldError) in try reg(tagList((0..<61).map { "t\($0)" })) })
    }

    func testReservedPrefixesAreRefused() {
        for t in ["user:alice", "platform:ios", "device:phone-1", "user:", "device:x"] {
            assertBadRequest({ () throws(HeraldError) in try reg(tagList(["ok", t])) }, t)
        }
        XCTAssertNotNil(try? reg(tagList(["users:x", "xuser:y", "platforms", "device"])))
    }

    func testBadInputIsRefused() {
        for body in [#"{"platform":"mac"}"#, #"{"platform":1}"#, #"{"tags":"a"}"#, #"{"tags":[1]}"#, #"{"tags":[""]}"#,
                     #"{"tags":["a b"]}"#, #"{"tags":[null]}"#, #"{"tags":["\#(String(repeating: "t", count: 161))"]}"#,
                     #"{"deviceId":"x"}"#, "[]", "{", #"{"tags":["é"]}"#] {
            assertBadRequest({ () throws(HeraldError) in try reg(body) }, body)
        }
        XCTAssertNotNil(try? reg(tagList([String(repeating: "t", count: 160)])))
    }

    func testAppliedToANewDevice() {
        let d = DeviceRegistration().applied(to: nil, deviceId: "phone-1", now: T0)
        XCTAssertEqual(d.deviceId, "phone-1")
        XCTAssertEqual(d.platform, .other)
        XCTAssertEqual(d.tags, [])
        XCTAssertEqual(d.lastSeenAt, T0)
        XCTAssertEqual(d.viewGeneration, 0)
        let e = DeviceRegistration(platform: .ios, tags: ["a"]).applied(to: nil, deviceId: "phone-1", now: T0)
        XCTAssertEqual(e.platform, .ios)
        XCTAssertEqual(e.tags, ["a"])
        XCTAssertEqual(e.viewGeneration, 0)
    }

    func testViewGenerationBumpsOnlyOnARealChange() {
        let d = Device(deviceId: "phone-1", platform: .ios, tags: ["a", "b"], lastSeenAt: T0, viewGeneration: 3)
        let same = DeviceRegistration(platform: .ios, tags: ["a", "b"]).applied(to: d, deviceId: "phone-1", now: T0 + 1)
        XCTAssertEqual(same.viewGeneration, 3)
        XCTAssertEqual(same.lastSeenAt, T0 + 1, "lastSeenAt refreshed")
        XCTAssertEqual(DeviceRegistration().applied(to: d, deviceId: "phone-1", now: T0 + 1).viewGeneration, 3,
                       "absent fields keep what is registered")
        XCTAssertEqual(DeviceRegistration().applied(to: d, deviceId: "phone-1", now: T0 + 1).tags, ["a", "b"])
        let plat = DeviceRegistration(platform: .web).applied(to: d, deviceId: "phone-1", now: T0 + 1)
        XCTAssertEqual(plat.viewGeneration, 4)
        XCTAssertEqual(plat.tags, ["a", "b"])
        XCTAssertEqual(DeviceRegistration(tags: ["a"]).applied(to: d, deviceId: "phone-1", now: T0 + 1).viewGeneration, 4)
        XCTAssertEqual(DeviceRegistration(tags: []).applied(to: d, deviceId: "phone-1", now: T0 + 1).viewGeneration, 4)
        XCTAssertEqual(DeviceRegistration(platform: .web, tags: ["c"]).applied(to: d, deviceId: "phone-1", now: T0 + 1)
            .viewGeneration, 4, "one bump per registration")
    }

    func testAllTagsIncludeTheBuiltIns() {
        let d = Device(deviceId: "phone-1", platform: .ios, tags: ["lang:it"], lastSeenAt: T0)
        XCTAssertEqual(Set(d.allTags(userId: "alice")), ["user:alice", "platform:ios", "device:phone-1", "lang:it"])
    }
}

final class TokenRequestTests: XCTestCase {
    func req(_ body: String) throws(HeraldError) -> TokenRequest { try TokenRequest(bytes: bytes(body)) }

    func testDefaults() throws {
        let r = try req(#"{"userId":"alice"}"#)
        XCTAssertEqual(r.userId, "alice")
        XCTAssertEqual(r.ttlSeconds, 3600)
        XCTAssertNil(r.deviceId)
        let s = try req(#"{"userId":"alice","ttlSeconds":60,"deviceId":"phone-1"}"#)
        XCTAssertEqual(s.ttlSeconds, 60)
        XCTAssertEqual(s.deviceId, "phone-1")
        XCTAssertNil(try req(#"{"userId":"alice","deviceId":null}"#).deviceId)
    }

    func testTTLRange() throws {
        XCTAssertEqual(try req(#"{"userId":"a","ttlSeconds":2592000}"#).ttlSeconds, 2_592_000)
        XCTAssertEqual(try req(#"{"userId":"a","ttlSeconds":60}"#).ttlSeconds, 60)
        for t in ["59", "0", "-60", "2592001", "3600.5", #""3600""#, "1e4"] {
            assertBadRequest({ () throws(HeraldError) in try req(#"{"userId":"a","ttlSeconds":\#(t)}"#) }, t)
        }
    }

    func testBadBodies() {
        for body in ["{}", #"{"userId":""}"#, #"{"userId":"a b"}"#, #"{"userId":5}"#, #"{"userId":"a","deviceId":"x y"}"#,
                     #"{"userId":"a","extra":1}"#, "", "[]", #"{"userId":"a","userId":"b"}"#] {
            assertBadRequest({ () throws(HeraldError) in try req(body) }, body)
        }
    }
}

final class FieldsTests: XCTestCase {
    func testUnknownKeysAreNamedAndTruncated() {
        var f = try! Fields(bytes: bytes(#"{"a":1,"b":2}"#))
        _ = try? f.int("a", in: 0...5)
        let e = heraldError({ () throws(HeraldError) in try f.finish() })
        XCTAssertEqual(e?.code, .badRequest)
        XCTAssertTrue(e?.message.contains("\"b\"") ?? false, e?.message ?? "")
    }

    func testHasTreatsNullAsAbsent() {
        let f = try! Fields(bytes: bytes(#"{"a":null,"b":0}"#))
        XCTAssertFalse(f.has("a"))
        XCTAssertTrue(f.has("b"))
        XCTAssertFalse(f.has("c"))
    }

    func testStringLengthLimitIsInBytes() {
        var f = try! Fields(bytes: bytes(#"{"s":"éé"}"#))
        assertBadRequest({ () throws(HeraldError) in try f.string("s", maxBytes: 3) })
        var g = try! Fields(bytes: bytes(#"{"s":"éé"}"#))
        XCTAssertEqual(try g.string("s", maxBytes: 4), "éé")
    }

    func testErrorJSONShape() {
        XCTAssertEqual(HeraldError(.preconditionFailed, "m").json.encodedString,
                       #"{"error":{"code":"precondition_failed","message":"m"}}"#)
        let statuses = [ErrorCode.badRequest: 400, .unauthorized: 401, .forbidden: 403, .notFound: 404,
                        .methodNotAllowed: 405, .preconditionFailed: 412, .tooLarge: 413, .rateLimited: 429, .unavailable: 503]
        for (c, s) in statuses { XCTAssertEqual(c.httpStatus, s, c.rawValue) }
        XCTAssertEqual(ErrorCode.methodNotAllowed.rawValue, "method_not_allowed")
        XCTAssertEqual(ErrorCode.rateLimited.rawValue, "rate_limited")
    }
}
