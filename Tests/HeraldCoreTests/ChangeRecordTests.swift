import XCTest
@testable import HeraldCore

final class ChangeRecordTests: XCTestCase {
    let unnamed = Viewer.unnamed
    let phone = Viewer(userId: "alice", device: Device(deviceId: "phone-1", platform: .ios, tags: ["lang:it"], lastSeenAt: T0))
    let laptop = Viewer(userId: "alice", device: Device(deviceId: "laptop", platform: .web, tags: ["lang:en", "muted"], lastSeenAt: T0))
    var all: [Viewer] { [unnamed, phone, laptop] }

    func upsert(_ n: Note, before: Note?, seq: Int64 = 10) -> ChangeRecord {
        ChangeRecord(change: Change(seq: seq, op: .upsert(n)), before: before.map(Presence.init), after: Presence(n), at: T0)
    }

    func delete(_ n: Note, reason: DeleteReason = .deleted, seq: Int64 = 11) -> ChangeRecord {
        ChangeRecord(change: Change(seq: seq, op: .delete(id: n.id, appNotificationId: n.appNotificationId, reason: reason)),
                     before: Presence(n), after: nil, at: T0)
    }

    func decoded(_ b: [UInt8]?) -> JSON? { b.flatMap { try? JSONParser.parse($0) } }

    // MARK: wire form

    func testChangeJSON() {
        let n = Note.sample()
        let up = Change(seq: 42, op: .upsert(n)).json
        XCTAssertEqual(up.objectValue?.keys, ["seq", "op", "notification"])
        XCTAssertEqual(up.objectValue?["seq"], .number("42"))
        XCTAssertEqual(up.objectValue?["op"], "upsert")
        XCTAssertEqual(up.objectValue?["notification"], n.json)
        XCTAssertEqual(Change(seq: 43, op: .delete(id: "n_1", appNotificationId: "task-42", reason: .expired)).json.encodedString,
                       #"{"seq":43,"op":"delete","id":"n_1","appNotificationId":"task-42","reason":"expired"}"#)
    }

    func testEncodedIsTheChangeJSON() {
        let r = upsert(Note.sample(), before: nil)
        XCTAssertEqual(r.encoded, r.change.json.encoded)
        XCTAssertEqual(r.seq, 10)
        let d = delete(Note.sample())
        XCTAssertEqual(d.encoded, d.change.json.encoded)
    }

    /// The store's row and the writer's answer take the notification's bytes
    /// from the change: they must be exactly its encoding, at any seq.
    func testAnUpsertsNotificationBytesAreTheNotificationsEncoding() {
        var n = Note.sample()
        n.payload["body"] = .string(String(repeating: "ab\"c\\d\n", count: 8_000))
        for seq: Int64 in [1, 9, 10, 12_345, .max] {
            let r = upsert(n, before: nil, seq: seq)
            XCTAssertEqual(r.encoded, r.change.json.encoded)
            XCTAssertEqual(r.notificationJSON.map(Array.init), n.json.encoded)
        }
        XCTAssertNil(delete(n).notificationJSON)
    }

    /// A store reads a notification back out of its stored upsert only when
    /// the bytes are that upsert's.
    func testANotificationIsFoundInsideItsStoredUpsertOnly() throws {
        let n = Note.sample()
        func range(_ seq: Int64, _ bytes: [UInt8]) -> Range<Int>? {
            bytes.withUnsafeBufferPointer { ChangeRecord.notificationRange(inUpsert: seq, of: $0) }
        }
        for seq: Int64 in [1, 9, 10, 12_345, .max] {
            let r = upsert(n, before: nil, seq: seq)
            XCTAssertEqual(range(seq, r.encoded).map { Array(r.encoded[$0]) }, n.json.encoded)
        }
        let r = upsert(n, before: nil, seq: 42)
        XCTAssertNil(range(43, r.encoded), "another upsert's seq, as many digits")
        XCTAssertNil(range(4, r.encoded))
        let cut = Array(r.encoded.dropLast())
        XCTAssertThrowsError(try JSONParser.parse(Array(cut[range(42, cut) ?? 0..<0])), "cut short: not a notification")
        XCTAssertNil(range(42, Array(r.encoded.prefix(30))))
        XCTAssertNil(range(42, delete(n, seq: 42).encoded))
        XCTAssertNil(range(42, []))
    }

    func testAWritesAnswerCarriesTheNotificationAndTheSeq() throws {
        let n = Note.sample()
        let r = upsert(n, before: nil, seq: 77)
        XCTAssertEqual(try JSONParser.parse(WriteAnswer(r).httpBody), ["notification": n.json, "seq": 77])
        XCTAssertEqual(try JSONParser.parse(WriteAnswer(unchanged: n, seq: 78).httpBody), ["notification": n.json, "seq": 78])
        XCTAssertEqual(String(decoding: ServerFrame.ack(ref: "c1", WriteAnswer(delete(n, seq: 79))), as: UTF8.self),
                       #"{"type":"ack","ref":"c1","seq":79}"#)
        XCTAssertEqual(try JSONParser.parse(ServerFrame.ack(ref: nil, WriteAnswer(r))),
                       ["type": "ack", "ref": nil, "notification": n.json, "seq": 77])
    }

    // MARK: bytes(for:)

    func testCreateForEveryoneReachesEveryone() {
        let r = upsert(Note.sample(), before: nil)
        for v in all { XCTAssertEqual(r.bytes(for: v), r.encoded) }
    }

    func testCreateTargetedReachesOnlyAdmittedViewers() {
        let r = upsert(Note.sample(tags: "lang:it"), before: nil)
        XCTAssertEqual(r.bytes(for: unnamed), r.encoded, "an unnamed viewer sees everything")
        XCTAssertEqual(r.bytes(for: phone), r.encoded)
        XCTAssertNil(r.bytes(for: laptop))
        let p = upsert(Note.sample(platforms: [.web, .android]), before: nil)
        XCTAssertNil(p.bytes(for: phone))
        XCTAssertEqual(p.bytes(for: laptop), p.encoded)
    }

    func testUpdateOfAnInvisibleNotificationStaysInvisible() {
        let old = Note.sample(tags: "lang:it")
        var new = old; new.readState = .read; new.version = 2
        let r = upsert(new, before: old)
        XCTAssertNil(r.bytes(for: laptop))
        XCTAssertEqual(r.bytes(for: phone), r.encoded)
        // Retargeted from one target that excludes the laptop to another that does too.
        let moved = upsert(Note.sample(platforms: [.android], tags: "lang:it", version: 2), before: old)
        XCTAssertNil(moved.bytes(for: laptop))
    }

    func testRetargetAwayGivesAHiddenDelete() {
        let old = Note.sample()
        let new = Note.sample(tags: "lang:it", version: 2)
        let r = upsert(new, before: old, seq: 77)
        XCTAssertEqual(r.bytes(for: phone), r.encoded)
        XCTAssertEqual(r.bytes(for: unnamed), r.encoded)
        let hidden = decoded(r.bytes(for: laptop))
        XCTAssertEqual(hidden?.encodedString,
                       #"{"seq":77,"op":"delete","id":"\#(old.id)","appNotificationId":"task-42","reason":"hidden"}"#)
        // Same by platform.
        let p = upsert(Note.sample(platforms: [.ios], version: 2), before: old, seq: 78)
        XCTAssertEqual(decoded(p.bytes(for: laptop))?.objectValue?["reason"], "hidden")
        XCTAssertEqual(decoded(p.bytes(for: laptop))?.objectValue?["seq"], .number("78"))
        XCTAssertEqual(p.bytes(for: phone), p.encoded)
    }

    func testRetargetTowardsAViewerGivesTheUpsert() {
        let r = upsert(Note.sample(version: 2), before: Note.sample(tags: "lang:it"))
        XCTAssertEqual(r.bytes(for: laptop), r.encoded)
        XCTAssertEqual(decoded(r.bytes(for: laptop))?.objectValue?["op"], "upsert")
    }

    func testDeleteReachesThoseWhoCouldSeeIt() {
        let r = delete(Note.sample(tags: "lang:it"))
        XCTAssertEqual(r.bytes(for: phone), r.encoded)
        XCTAssertEqual(r.bytes(for: unnamed), r.encoded)
        XCTAssertNil(r.bytes(for: laptop))
        XCTAssertEqual(decoded(r.bytes(for: phone))?.objectValue?["reason"], "deleted")
        let e = delete(Note.sample(), reason: .expired)
        for v in all { XCTAssertEqual(decoded(e.bytes(for: v))?.objectValue?["reason"], "expired") }
    }

    func testBuiltInTagsAreVisibleToExpressions() {
        let user = upsert(Note.sample(tags: "user:alice"), before: nil)
        XCTAssertNotNil(user.bytes(for: phone))
        XCTAssertNotNil(user.bytes(for: laptop))
        for expr in ["device:phone-1", "platform:ios", "!device:laptop", "platform:ios && lang:it"] {
            let r = upsert(Note.sample(tags: expr), before: nil)
            XCTAssertNotNil(r.bytes(for: phone), expr)
            XCTAssertNil(r.bytes(for: laptop), expr)
        }
        XCTAssertNil(upsert(Note.sample(tags: "user:bob"), before: nil).bytes(for: phone))
    }

    // MARK: badgeDelta(for:)

    func testUnreadDeltaForCreate() {
        XCTAssertEqual(all.map { upsert(Note.sample(), before: nil).badgeDelta(for: $0).unread }, [1, 1, 1])
        XCTAssertEqual(all.map { upsert(Note.sample(tags: "lang:it"), before: nil).badgeDelta(for: $0).unread }, [1, 1, 0])
    }

    func testUnreadDeltaForReadAndUnread() {
        let unread = Note.sample(), read = Note.sample(read: .read, version: 2)
        XCTAssertEqual(all.map { upsert(read, before: unread).badgeDelta(for: $0).unread }, [-1, -1, -1])
        XCTAssertEqual(all.map { upsert(unread, before: read).badgeDelta(for: $0).unread }, [1, 1, 1])
        XCTAssertEqual(all.map { upsert(read, before: read).badgeDelta(for: $0).unread }, [0, 0, 0])
        var dismissed = unread; dismissed.userActionState = .dismissed
        XCTAssertEqual(all.map { upsert(dismissed, before: unread).badgeDelta(for: $0).unread }, [0, 0, 0])
        let tRead = Note.sample(tags: "lang:it", read: .read, version: 2), tUnread = Note.sample(tags: "lang:it")
        XCTAssertEqual(all.map { upsert(tRead, before: tUnread).badgeDelta(for: $0).unread }, [-1, -1, 0])
    }

    func testUnreadDeltaForRetarget() {
        let everyone = Note.sample(), itOnly = Note.sample(tags: "lang:it", version: 2)
        XCTAssertEqual(all.map { upsert(itOnly, before: everyone).badgeDelta(for: $0).unread }, [0, 0, -1])
        XCTAssertEqual(all.map { upsert(everyone, before: itOnly).badgeDelta(for: $0).unread }, [0, 0, 1])
        // Retargeted away and read at once.
        let itRead = Note.sample(tags: "lang:it", read: .read, version: 2)
        XCTAssertEqual(all.map { upsert(itRead, before: everyone).badgeDelta(for: $0).unread }, [-1, -1, -1])
        // A read notification moving does not move the count.
        let readAll = Note.sample(read: .read)
        XCTAssertEqual(all.map { upsert(itRead, before: readAll).badgeDelta(for: $0).unread }, [0, 0, 0])
    }

    func testUnreadDeltaForDelete() {
        XCTAssertEqual(all.map { delete(Note.sample()).badgeDelta(for: $0).unread }, [-1, -1, -1])
        XCTAssertEqual(all.map { delete(Note.sample(read: .read)).badgeDelta(for: $0).unread }, [0, 0, 0])
        XCTAssertEqual(all.map { delete(Note.sample(tags: "lang:it")).badgeDelta(for: $0).unread }, [-1, -1, 0])
        XCTAssertEqual(all.map { delete(Note.sample(), reason: .expired).badgeDelta(for: $0).unread }, [-1, -1, -1])
    }

    func testUnseenDeltaApartFromUnread() {
        let fresh = Note.sample()
        var seen = fresh; seen.seenState = .seen; seen.version = 2
        XCTAssertEqual(all.map { upsert(seen, before: fresh).badgeDelta(for: $0) }, Array(repeating: Badge(unread: 0, unseen: -1), count: 3))
        // Read (and so seen) from seen: only unread moves.
        var read = seen; read.readState = .read; read.version = 3
        XCTAssertEqual(all.map { upsert(read, before: seen).badgeDelta(for: $0) }, Array(repeating: Badge(unread: -1, unseen: 0), count: 3))
        // Unread again leaves it seen.
        var unreadAgain = read; unreadAgain.readState = .unread; unreadAgain.version = 4
        XCTAssertEqual(all.map { upsert(unreadAgain, before: read).badgeDelta(for: $0) }, Array(repeating: Badge(unread: 1, unseen: 0), count: 3))
        XCTAssertEqual(all.map { upsert(fresh, before: nil).badgeDelta(for: $0) }, Array(repeating: Badge(unread: 1, unseen: 1), count: 3))
        XCTAssertEqual(all.map { delete(seen).badgeDelta(for: $0) }, Array(repeating: Badge(unread: -1, unseen: 0), count: 3))
        let tagged = Note.sample(tags: "lang:it")
        var taggedSeen = tagged; taggedSeen.seenState = .seen
        XCTAssertEqual(all.map { upsert(taggedSeen, before: tagged).badgeDelta(for: $0).unseen }, [-1, -1, 0])
    }

    func testPresenceOnTheBusCarriesUnseen() {
        var n = Note.sample(tags: "lang:it"); n.seenState = .seen
        let p = Presence(n)
        XCTAssertEqual(p.unseen, false)
        XCTAssertEqual(Presence(json: p.json), p)
        // From a node before `unseen`: as unread implies.
        var o = p.json.objectValue!
        o["unseen"] = nil
        XCTAssertEqual(Presence(json: .object(o))?.unseen, true)
    }

    // MARK: viewers

    func testViewerEpochCarriesViewGeneration() {
        XCTAssertEqual(Viewer.unnamed.epoch(store: "E"), "E")
        XCTAssertEqual(phone.epoch(store: "E"), "E", "generation 0 is the store epoch")
        let d = Device(deviceId: "phone-1", platform: .ios, tags: [], lastSeenAt: T0, viewGeneration: 2)
        let v2 = Viewer(userId: "alice", device: d)
        XCTAssertEqual(v2.epoch(store: "E"), "E.2")
        var d3 = d; d3.viewGeneration = 3
        XCTAssertNotEqual(Viewer(userId: "alice", device: d3).epoch(store: "E"), v2.epoch(store: "E"))
        XCTAssertNotEqual(v2.epoch(store: "F"), v2.epoch(store: "E"))
    }

    func testViewerTagsIncludeBuiltIns() {
        for tag in ["user:alice", "platform:ios", "device:phone-1", "lang:it"] {
            XCTAssertEqual(phone.device?.has(tag), true, tag)
        }
        for tag in ["user:bob", "platform:web", "device:phone-2", "lang:en", "user:", "alice", "phone-1", "ios"] {
            XCTAssertEqual(phone.device?.has(tag), false, tag)
        }
        XCTAssertEqual(phone.device?.platform, .ios)
        XCTAssertEqual(phone.device?.deviceId, "phone-1")
    }

    func testTargetingAdmits() {
        XCTAssertTrue(Targeting.everyone.admits(phone))
        XCTAssertTrue(Targeting(platforms: [.ios], tags: nil).admits(phone))
        XCTAssertFalse(Targeting(platforms: [.web], tags: nil).admits(phone))
        XCTAssertFalse(Targeting(platforms: [.ios], tags: try! TagExpression.parse("muted")).admits(phone))
        XCTAssertTrue(Targeting(platforms: [.web], tags: try! TagExpression.parse("muted")).admits(laptop))
        XCTAssertTrue(Targeting(platforms: [.web], tags: try! TagExpression.parse("nothing")).admits(.unnamed))
    }
}
