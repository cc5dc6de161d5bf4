import XCTest
@testable import HeraldCore

final class WebhookEventTests: XCTestCase {
    let alice = UserKey(app: "app", user: "alice")

    /// Every event a change gives, as `WebhookDispatch.note` builds them for an endpoint taking all.
    func events(_ user: UserKey, _ change: Change, at: Millis, previous: HeraldCore.Notification?, published: Bool,
                by actor: ChangeActor) -> [WebhookEvent] {
        WebhookEvent.events(user, change, at: at, types: WebhookEvent.types(change, previous: previous, published: published, by: actor),
                            by: actor)
    }

    func note(_ read: ReadState = .unread, _ seen: SeenState = .unseen, _ action: UserActionState = .noInteraction,
              version: Int64 = 1) -> HeraldCore.Notification {
        Notification(id: "n_1", appNotificationId: "task-1", userId: "alice", payload: [:], createdAt: 0, updatedAt: 0,
                     expiresAt: 1000, readState: read, seenState: seen, userActionState: action, version: version)
    }

    func types(_ previous: HeraldCore.Notification?, _ next: HeraldCore.Notification, published: Bool = false, by actor: ChangeActor = .device("phone")) -> [String] {
        events(alice, Change(seq: 7, op: .upsert(next)), at: 5, previous: previous, published: published, by: actor)
            .map(\.type.rawValue)
    }

    func testAPublishIsCreatedOrReplaced() {
        XCTAssertEqual(types(nil, note(), published: true, by: .app), ["notification.created"])
        XCTAssertEqual(types(note(.read, .seen), note(version: 2), published: true, by: .app), ["notification.replaced"],
                       "a replacement resets the states: it is one event, not unread too")
    }

    func testOneEventPerStateChangedInOneOrder() {
        XCTAssertEqual(types(note(), note(.read, .seen)), ["notification.read", "notification.seen"])
        XCTAssertEqual(types(note(.read, .seen), note(.unread, .seen)), ["notification.unread"])
        XCTAssertEqual(types(note(), note(.unread, .seen)), ["notification.seen"])
        XCTAssertEqual(types(note(.unread, .seen), note(.read, .seen, .dismissed)), ["notification.read", "notification.dismissed"])
        XCTAssertEqual(types(note(), note(.unread, .unseen, .activated)), ["notification.activated"])
        XCTAssertEqual(types(note(), note(.unread, .unseen, .snoozed)), ["notification.snoozed"])
        XCTAssertEqual(types(note(.unread, .unseen, .snoozed), note()), [], "back to noInteraction names no event")
    }

    func testAWakeIsWokeAlone() {
        XCTAssertEqual(types(note(.read, .seen, .snoozed), note(version: 2), by: .wake), ["notification.woke"])
    }

    func testDataNamesTheActorTheSeqAndTheNotification() throws {
        let e = events(alice, Change(seq: 7, op: .upsert(note(.read, .seen))), at: 5, previous: note(), published: false,
                                    by: .device("phone"))
        XCTAssertEqual(e.count, 2)
        XCTAssertEqual(e.map(\.data["seq"]), [.int(7), .int(7)], "one request: one seq for both")
        let data = e[0].data
        XCTAssertEqual(data["appId"], "app")
        XCTAssertEqual(data["userId"], "alice")
        XCTAssertEqual(data["deviceId"], "phone")
        XCTAssertEqual(e[0].notification?.readState, .read)
        let body = try JSONParser.parse(e[0].body).objectValue?["data"]?.objectValue
        XCTAssertEqual(body?["notification"], note(.read, .seen).json, "the body's data carries the notification")
        XCTAssertEqual(body?["deviceId"], "phone")
        let app = events(alice, Change(seq: 1, op: .upsert(note())), at: 5, previous: nil, published: true, by: .app)
        XCTAssertEqual(app[0].data["deviceId"], .null)
    }

    func testDeletesAndExpiriesButNoHiddenOnes() {
        func deleted(_ reason: DeleteReason, by actor: ChangeActor) -> [WebhookEvent] {
            events(alice, Change(seq: 9, op: .delete(id: "n_1", appNotificationId: "task-1", reason: reason)), at: 5,
                                previous: note(), published: false, by: actor)
        }
        let e = deleted(.expired, by: .herald)
        XCTAssertEqual(e.map(\.type), [.deleted])
        XCTAssertEqual(e[0].data["id"], "n_1")
        XCTAssertEqual(e[0].data["appNotificationId"], "task-1")
        XCTAssertEqual(e[0].data["reason"], "expired")
        XCTAssertEqual(e[0].data["deviceId"], .null)
        XCTAssertEqual(deleted(.deleted, by: .device("phone"))[0].data["deviceId"], "phone")
        XCTAssertEqual(deleted(.hidden, by: .app), [])
    }

    func testPreferencesAndUnregisteredEvents() {
        let saved = Preferences(default: Channels(push: false), version: 3, updatedAt: 5)
        let change = Change(seq: 12, op: .preferences(saved))
        let types = WebhookEvent.types(change, previous: nil, published: false, by: .device("phone"))
        XCTAssertEqual(types, [.preferencesUpdated])
        let p = WebhookEvent.events(alice, change, at: 5, types: types, by: .device("phone"))[0]
        XCTAssertEqual(p.type, .preferencesUpdated)
        XCTAssertEqual(p.data["preferences"], saved.json)
        XCTAssertEqual(p.data["seq"], .int(12))
        XCTAssertEqual(p.data["deviceId"], "phone")
        let u = WebhookEvent.pushUnregistered(alice, device: ["deviceId": "phone"], service: .apns, at: 5)
        XCTAssertEqual(u.data["seq"], .null)
        XCTAssertEqual(u.data["deviceId"], .null)
        XCTAssertEqual(u.data["service"], "apns")
        XCTAssertEqual(u.data["device"], ["deviceId": "phone"])
    }

    func testTheBodyIsTypeTimestampAndData() throws {
        let e = WebhookEvent(.read, at: 1_764_000_000_123, data: ["appId": "app"])
        let body = try JSONParser.parse(e.body)
        XCTAssertEqual(body, ["type": "notification.read", "timestamp": "2025-11-24T16:00:00.123Z", "data": ["appId": "app"]])
    }

    func testStandardBase64() {
        XCTAssertEqual(Base64.encode(Array("hello".utf8)), "aGVsbG8=")
        XCTAssertEqual(Base64.encode([0xFB, 0xFF]), "+/8=")
        XCTAssertEqual(Base64.decode("+/8="), [0xFB, 0xFF])
        XCTAssertNil(Base64.decode("-_8="), "the URL alphabet is not base64")
        XCTAssertNil(Base64.decode("+/8"), "unpadded")
    }
}
