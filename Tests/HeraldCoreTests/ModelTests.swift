import XCTest
@testable import HeraldCore

final class NotificationModelTests: XCTestCase {
    func testWireFormKeysAndValues() {
        var n = Note.sample(platforms: [.web, .ios], tags: "lang:it && !muted", read: .read, version: 2)
        n.groupName = "tasks"
        n.displayTimeToLive = 600
        n.userActionState = .dismissed
        n.updatedAt = T0 + 300_000
        let o = n.json.objectValue!
        XCTAssertEqual(o.keys, ["id", "appNotificationId", "userId", "payload", "priority", "groupName", "displayTimeToLive",
                                "targetPlatforms", "targetTags", "createdAt", "updatedAt", "expiresAt", "readState",
                                "seenState", "userActionState", "snoozedUntil", "version"])
        XCTAssertEqual(o["priority"], "normal")
        XCTAssertEqual(o["groupName"], "tasks")
        XCTAssertEqual(o["displayTimeToLive"], .number("600"))
        XCTAssertEqual(o["targetPlatforms"], ["web", "ios"])
        XCTAssertEqual(o["targetTags"], "lang:it && !muted")
        XCTAssertEqual(o["createdAt"], "2026-11-22T10:00:00.000Z")
        XCTAssertEqual(o["updatedAt"], "2026-11-22T10:05:00.000Z")
        XCTAssertEqual(o["expiresAt"], "2026-12-22T10:00:00.000Z")
        XCTAssertEqual(o["readState"], "read")
        XCTAssertEqual(o["seenState"], "seen")
        XCTAssertEqual(o["userActionState"], "dismissed")
        XCTAssertEqual(o["version"], .number("2"))
    }

    func testAbsentOptionalsAreNull() {
        let o = Note.sample().json.objectValue!
        for k in ["groupName", "displayTimeToLive", "targetPlatforms", "targetTags"] {
            XCTAssertEqual(o[k], .null, k)
        }
        XCTAssertEqual(o["readState"], "unread")
        XCTAssertEqual(o["seenState"], "unseen")
        XCTAssertEqual(o["userActionState"], "noInteraction")
        XCTAssertEqual(o["version"], .number("1"))
    }

    func testSeenStateRoundTripsApartFromReadState() {
        var n = Note.sample()
        n.seenState = .seen  // unread but seen
        XCTAssertEqual(n.json.objectValue!["seenState"], "seen")
        XCTAssertEqual(Note(json: n.json), n)
        n.readState = .read
        n.seenState = .unseen  // read, then explicitly unseen again
        XCTAssertEqual(Note(json: n.json), n)
    }

    /// What was stored before `seenState` existed: read ones seen, unread ones unseen.
    func testAnAbsentSeenStateIsWhatReadStateImplies() {
        for (read, seen) in [(ReadState.read, SeenState.seen), (.unread, .unseen)] {
            var o = Note.sample(read: read).json.objectValue!
            o["seenState"] = nil
            XCTAssertEqual(Note(json: .object(o))?.seenState, seen)
        }
        var bad = Note.sample().json.objectValue!
        bad["seenState"] = "maybe"
        XCTAssertNil(Note(json: .object(bad)))
    }

    func testJSONRoundTrip() {
        var n = Note.sample(platforms: [.android], tags: "(a || b) && !c", read: .read, version: 9)
        n.payload = try! JSONParser.parse(#"{"z":1.0e2,"a":[{"q":"é\n"}],"n":null}"#).objectValue!
        n.groupName = "g"; n.displayTimeToLive = 0; n.priority = .high; n.userActionState = .snoozed
        n.createdAt = T0 + 1; n.updatedAt = T0 + 2; n.expiresAt = T0 + 3; n.snoozedUntil = T0 + 4
        XCTAssertEqual(n.json.objectValue?["snoozedUntil"], "2026-11-22T10:00:00.004Z")
        XCTAssertEqual(Note(json: n.json), n)
        XCTAssertEqual(Note(json: try! JSONParser.parse(n.json.encoded)), n)
        XCTAssertEqual(Note(json: Note.sample().json), Note.sample())
    }

    func testTheWireFormIsWrittenByteForByte() {
        var n = Note.sample(platforms: [.web, .ios], tags: "lang:it && !muted", version: 12)
        n.payload = try! JSONParser.parse(#"{"title":"say \"hi\"","n":[1.5e3,null,true]}"#).objectValue!
        n.groupName = "tab\there"
        n.displayTimeToLive = 600
        n.priority = .high
        n.expiresAt = 253_402_300_800_000 // year 10000: past the four-digit fast path
        XCTAssertEqual(String(decoding: n.encoded, as: UTF8.self),
                       #"{"id":"n_01AAAAAAAAAAAAAAAAAAAAAAAA","appNotificationId":"task-42","userId":"alice","#
                       + #""payload":{"title":"say \"hi\"","n":[1.5e3,null,true]},"priority":"high","groupName":"tab\there","#
                       + #""displayTimeToLive":600,"targetPlatforms":["web","ios"],"targetTags":"lang:it && !muted","#
                       + #""createdAt":"2026-11-22T10:00:00.000Z","updatedAt":"2026-11-22T10:00:00.000Z","#
                       + #""expiresAt":"10000-01-01T00:00:00.000Z","readState":"unread","seenState":"unseen","userActionState":"noInteraction","snoozedUntil":null,"version":12}"#)
        XCTAssertEqual(String(decoding: Note.sample().encoded, as: UTF8.self).split(separator: ",").suffix(12).joined(separator: ","),
                       #""groupName":null,"displayTimeToLive":null,"targetPlatforms":null,"targetTags":null,"#
                       + #""createdAt":"2026-11-22T10:00:00.000Z","updatedAt":"2026-11-22T10:00:00.000Z","#
                       + #""expiresAt":"2026-12-22T10:00:00.000Z","readState":"unread","seenState":"unseen","userActionState":"noInteraction","snoozedUntil":null,"version":1}"#)
    }

    func testInitFromBadJSONIsNil() {
        XCTAssertNil(Note(json: "x"))
        var o = Note.sample().json.objectValue!
        o["readState"] = "seen"
        XCTAssertNil(Note(json: .object(o)))
        o = Note.sample().json.objectValue!
        o["createdAt"] = "yesterday"
        XCTAssertNil(Note(json: .object(o)))
        o = Note.sample().json.objectValue!
        o["version"] = nil
        XCTAssertNil(Note(json: .object(o)))
    }
}

final class ServerFrameTests: XCTestCase {
    func parsed(_ b: [UInt8], file: StaticString = #filePath, line: UInt = #line) -> JSONObject {
        do { return try JSONParser.parse(b).objectValue! } catch {
            XCTFail("frame is not JSON: \(String(decoding: b, as: UTF8.self))", file: file, line: line)
            return [:]
        }
    }

    func testChangesFrame() {
        let c1 = Change(seq: 5, op: .upsert(Note.sample())).json.encoded
        let c2 = Change(seq: 7, op: .delete(id: "n_1", appNotificationId: "a", reason: .hidden)).json.encoded
        let f = parsed(ServerFrame.changes([c1, c2], cursor: 9))
        XCTAssertEqual(f.keys.first, "type")
        XCTAssertEqual(f["type"], "changes")
        XCTAssertEqual(f["changes"]?.arrayValue?.map { $0.encoded }, [c1, c2])
        XCTAssertEqual(f["cursor"], .number("9"))
        XCTAssertEqual(parsed(ServerFrame.changes([], cursor: 0))["changes"], [])
    }

    func testChangeFrame() {
        let c = Change(seq: 5, op: .upsert(Note.sample())).json
        var bytes: [UInt8] = []
        var declared = -1
        ServerFrame.appendLive([c.encoded][...], cursor: 5, to: &bytes) { _, n in declared = n }
        XCTAssertEqual(declared, bytes.count)
        let f = parsed(bytes)
        XCTAssertEqual(f.keys, ["type", "change"])
        XCTAssertEqual(f["type"], "change")
        XCTAssertEqual(f["change"], c)
    }

    func testResetWelcomeAckErrorCountsPongTokenExpiring() {
        let r = parsed(ServerFrame.reset([Note.sample().json.encoded], cursor: 3, epoch: "E", final: true, preferences: Preferences.unsaved.json.encoded))
        XCTAssertEqual(r.keys.first, "type")
        XCTAssertEqual(r["type"], "reset")
        XCTAssertEqual(r["notifications"], [Note.sample().json])
        XCTAssertEqual(r["cursor"], .number("3"))
        XCTAssertEqual(r["epoch"], "E")
        XCTAssertEqual(r["final"], true)
        XCTAssertEqual(r["preferences"], Preferences.unsaved.json, "the last frame of a reset carries the preferences")
        let first = parsed(ServerFrame.reset([], cursor: 0, epoch: "E", final: false, preferences: Preferences.unsaved.json.encoded))
        XCTAssertEqual(first["final"], false)
        XCTAssertNil(first["preferences"], "only the last frame carries them")

        let w = parsed(ServerFrame.welcome(cursor: 8, epoch: "E.1", connectionId: "c-1", badge: Badge(unread: 4, unseen: 3)))
        XCTAssertEqual(w.keys, ["type", "cursor", "epoch", "connectionId", "unread", "unseen"])
        XCTAssertEqual(w["type"], "welcome")
        XCTAssertEqual(w["unread"], .number("4"))
        XCTAssertEqual(w["unseen"], .number("3"))

        let a = parsed(ServerFrame.ack(ref: "c1", extra: ["seq": 12]))
        XCTAssertEqual(JSON.object(a).encodedString, #"{"type":"ack","ref":"c1","seq":12}"#)
        XCTAssertEqual(parsed(ServerFrame.ack(ref: nil, extra: [:]))["ref"], .null)

        let e = parsed(ServerFrame.error(ref: "c9", HeraldError(.preconditionFailed, "version \"3\" expected")))
        XCTAssertEqual(JSON.object(e).encodedString,
                       #"{"type":"error","ref":"c9","code":"precondition_failed","message":"version \"3\" expected"}"#)

        XCTAssertEqual(JSON.object(parsed(ServerFrame.counts(Badge(unread: 2, unseen: 5)))).encodedString,
                       #"{"type":"counts","unread":2,"unseen":5}"#)
        XCTAssertEqual(JSON.object(parsed(ServerFrame.pong(ref: "c5"))).encodedString, #"{"type":"pong","ref":"c5"}"#)
        XCTAssertEqual(JSON.object(parsed(ServerFrame.tokenExpiring(T0))).encodedString,
                       #"{"type":"tokenExpiring","expiresAt":"2026-11-22T10:00:00.000Z"}"#)
    }
}
